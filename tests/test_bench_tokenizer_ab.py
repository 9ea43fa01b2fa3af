"""bench/tokenizer_ab.py renames an earlier commit's package so both load in one process."""

from __future__ import annotations

from bench.tokenizer_ab import _IMPORTS, BEFORE_PACKAGE, paired_ratios


def test_imports_of_the_package_are_renamed_and_nothing_else():
    source = ("import embedserve\nfrom embedserve import errors\nfrom embedserve.tokenizer.trie import x\n"
              "CACHE = Path('~/.cache/embedserve/tokenizer')\nimport embedserve_other\n")
    assert _IMPORTS.sub(BEFORE_PACKAGE, source) == (
        "import embedserve_before\nfrom embedserve_before import errors\n"
        "from embedserve_before.tokenizer.trie import x\n"
        "CACHE = Path('~/.cache/embedserve/tokenizer')\nimport embedserve_other\n")


def test_each_order_is_paired_and_the_estimate_is_their_geometric_mean():
    calls = []
    r = paired_ratios(lambda t: calls.append(("before", t)), lambda t: calls.append(("after", t)),
                      lambda t: calls.append(("ref", t)), ["a", "b"], passes=2)
    assert [c[0] for c in calls[:8]] == ["before", "ref", "after", "ref", "after", "ref", "before", "ref"]
    assert set(r["ratio"]) == {"before first", "after first"}
    assert abs(r["unbiased"] ** 2 - r["ratio"]["before first"] * r["ratio"]["after first"]) < 1e-12
