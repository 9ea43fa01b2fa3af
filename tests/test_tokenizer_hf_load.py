"""tokenizer.json loading: every supported pipeline shape equals tokenizers==0.23.3 on the
same file, and every unsupported one fails at load naming the file, field and what works.

Shape variants are built from the project-made XLM-R tokenizer.json (conftest
xlmr_tokenizer_dir) with its vocabulary cut to the first 8,000 pieces (fast to load, and
many characters become unknown, which exercises unknown-token scoring and fusing); each
variant file is its own reference. The texts: edge cases, sample strings in many scripts
and English lines that every checkout has, and, where the reference data is present,
UDHR and emoji lines.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import tokenizers

from conftest import python_docs_text
from embedserve.errors import ModelLoadError
from embedserve.tokenizer import Tokenizer
from tokenizer_corpus import SCRIPTS, emoji_lines, udhr_lines

SMALL_VOCAB = 8000
PRECOMPILED = "precompiled"  # placeholder replaced by the real charsmap step
REPLACE_SPACES = {"type": "Replace", "pattern": {"Regex": " {2,}"}, "content": " "}


def metaspace(**fields) -> dict:
    return {"type": "Metaspace", "replacement": "\u2581", **fields}


def sequence(*normalizers) -> dict:
    return {"type": "Sequence", "normalizers": list(normalizers)}


def after_whitespace_split(pre: dict) -> dict:
    return {"type": "Sequence", "pretokenizers": [{"type": "WhitespaceSplit"}, pre]}


STRIP_BOTH = {"type": "Strip", "strip_left": True, "strip_right": True}
ROBERTA = {"type": "RobertaProcessing", "sep": ["</s>", 2], "cls": ["<s>", 0], "trim_offsets": True,
           "add_prefix_space": True}

VARIANTS = {
    "legacy_add_prefix_space": (sequence(PRECOMPILED, REPLACE_SPACES),
                                {"type": "Metaspace", "replacement": "\u2581", "add_prefix_space": True,
                                 "str_rep": "\u2581"}, None),
    "strip_then_first_after_whitespace_split": (
        sequence(STRIP_BOTH, PRECOMPILED), after_whitespace_split(metaspace(prepend_scheme="first")), None),
    "first_without_split_left_strip": (
        sequence(PRECOMPILED, {"type": "Strip", "strip_left": True, "strip_right": False}),
        metaspace(prepend_scheme="first", split=True), None),
    "never_no_split": (PRECOMPILED, metaspace(prepend_scheme="never", split=False), None),
    "replaces_around_precompiled": (
        sequence({"type": "Replace", "pattern": {"String": "a"}, "content": "\u00e4\u0308"},
                 {"type": "Replace", "pattern": {"Regex": "\\.{2,}"}, "content": "\u2026"},
                 {"type": "Replace", "pattern": {"Regex": "x+"}, "content": "y"},
                 PRECOMPILED, REPLACE_SPACES, STRIP_BOTH),
        metaspace(prepend_scheme="always"), None),
    "no_normalizer_roberta_processing": (None, after_whitespace_split(metaspace()), ROBERTA),
    "underscore_replacement": (PRECOMPILED, {"type": "Metaspace", "replacement": "_",
                                             "prepend_scheme": "always", "split": True}, None),
}

EDGE_TEXTS = ["", " ", "   ", "\t\n", " a", "a ", "  a  b  ", "\u2581", "\u2581a \u2581\u2581b", "_x_",
              "x..y...z", "xxxa", "\u3000a\u3000", "\ufeffa", "\r\n\r\n", "\x00a\x00", "ｶ\u0301",
              "\u212b\u0301 \uff21\u0300", "a\u0301\u0302\u0303", "👍🏽 👨\u200d👩\u200d👧 🇯🇵🇺🇸", "ﷺ ㍻",
              # controls the charsmap deletes: before any text they shift the offsets, which
              # prepend_scheme "first" reads (test_tokenizer_hf_offsets.py)
              "\x01abc def", "\x7fword", "\ufb01\x01x"]


def small_xlmr(source: Path, tmp_path: Path, name: str, normalizer, pre_tokenizer, post_processor) -> Path:
    doc = json.loads(source.read_text(encoding="utf-8"))
    charsmap_step = doc["normalizer"]["normalizers"][0]
    doc["model"]["vocab"] = doc["model"]["vocab"][:SMALL_VOCAB]
    doc["added_tokens"] = [t for t in doc["added_tokens"] if t["id"] < SMALL_VOCAB]

    def resolve(node):
        if node == PRECOMPILED:
            return charsmap_step
        if isinstance(node, dict) and node.get("type") == "Sequence" and "normalizers" in node:
            return {**node, "normalizers": [resolve(n) for n in node["normalizers"]]}
        return node

    doc["normalizer"] = resolve(normalizer)
    doc["pre_tokenizer"] = pre_tokenizer
    if post_processor is not None:
        doc["post_processor"] = post_processor
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps(doc), encoding="utf-8")
    return path


@pytest.fixture(scope="module", params=["builtin", "udhr+emoji"])
def variant_texts(request) -> list[str]:
    if request.param == "builtin":
        english = [line for line in python_docs_text().split("\n") if line.strip()]
        # (not the line spelling special tokens: tokenizers makes control ids of it, we never do)
        lines = [text for text in SCRIPTS if "<s>" not in text] + english[::100]
    else:
        lines = udhr_lines()[::40] + emoji_lines()[::25]
    padded = [f"  {line} " for line in lines[::4]]
    return EDGE_TEXTS + lines + padded


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_pipeline_variant_matches_tokenizers(name, tmp_path, tokenizer_cache_dir, variant_texts,
                                             xlmr_tokenizer_dir):
    path = small_xlmr(xlmr_tokenizer_dir / "tokenizer.json", tmp_path, name, *VARIANTS[name])
    ours = Tokenizer.from_file(path, cache_dir=tokenizer_cache_dir)
    reference = tokenizers.Tokenizer.from_file(str(path))
    encoded = reference.encode_batch(variant_texts)  # (encode_batch_fast leaves offsets out)
    expected = [e.ids for e in encoded]
    got = ours.encode_batch(variant_texts, return_offsets=True)
    mismatches = [(t, got.sequence(i).tolist(), expected[i]) for i, t in enumerate(variant_texts)
                  if got.sequence(i).tolist() != expected[i]]
    assert not mismatches, f"{len(mismatches)} differ, e.g. {mismatches[:2]}"
    # Character offsets as tokenizers aligns them (test_tokenizer_hf_offsets.py has its rules).
    offsets = [(t, got.sequence_offsets(i).tolist(), [list(o) for o in encoded[i].offsets])
               for i, t in enumerate(variant_texts)]
    offsets = [case for case in offsets if case[1] != case[2]]
    assert not offsets, f"offsets: {len(offsets)} differ, e.g. {offsets[:2]}"
    # encode() runs the normalizers without source ranges (kernels/origins.py) except
    # where the ids read them (prepend_scheme "first"); encode_batch keeps them.
    single = [(t, ours.encode(t).tolist(), expected[i]) for i, t in enumerate(variant_texts)
              if ours.encode(t).tolist() != expected[i]]
    assert not single, f"encode(): {len(single)} differ, e.g. {single[:2]}"
    assert any(ours.unk_id in ids for ids in expected)  # unknowns were exercised
    for a, b in [("hello", "world"), ("  x ", ""), (variant_texts[30], variant_texts[31])]:
        assert ours.encode_pair(a, b).tolist() == reference.encode(a, b).ids


def test_first_scheme_encode_compiles_no_kernel_of_its_own(tmp_path, tokenizer_cache_dir, xlmr_tokenizer_dir):
    # Its ids read where words came from; encode_batch's kernel keeps that, so encode()
    # goes through it rather than compiling a single-text kernel that keeps it (~30 s).
    from embedserve.tokenizer.kernels.encode import encode_run, encode_with_template

    path = small_xlmr(xlmr_tokenizer_dir / "tokenizer.json", tmp_path, "first",
                      *VARIANTS["first_without_split_left_strip"])
    ours = Tokenizer.from_file(path, cache_dir=tokenizer_cache_dir)
    texts = ["  first words", "x", "á b", "no  space " * 40]
    batch = ours.encode_batch(texts)
    signatures = (len(encode_run.signatures), len(encode_with_template.signatures))
    reference = tokenizers.Tokenizer.from_file(str(path))
    assert [ours.encode(text).tolist() for text in texts] == \
        [batch.sequence(i).tolist() for i in range(len(texts))] == [reference.encode(t).ids for t in texts]
    assert (len(encode_run.signatures), len(encode_with_template.signatures)) == signatures


# ---- unsupported files ---------------------------------------------------------------
def minimal_doc() -> dict:
    """A tiny valid Unigram tokenizer.json (tokenizers loads it)."""
    return {
        "version": "1.0", "truncation": None, "padding": None,
        "added_tokens": [{"id": 0, "content": "<unk>", "single_word": False, "lstrip": False,
                          "rstrip": False, "normalized": False, "special": True}],
        "normalizer": None, "pre_tokenizer": metaspace(prepend_scheme="always", split=True),
        "post_processor": None, "decoder": None,
        "model": {"type": "Unigram", "unk_id": 0, "byte_fallback": False,
                  "vocab": [["<unk>", 0.0], ["\u2581a", -1.0], ["a", -2.0], ["\u2581", -3.0], ["b", -9.0]]},
    }


def test_minimal_file_matches_tokenizers(tmp_path, tokenizer_cache_dir):
    path = tmp_path / "tokenizer.json"
    path.write_text(json.dumps(minimal_doc()))
    ours = Tokenizer.from_file(path, cache_dir=tokenizer_cache_dir)
    reference = tokenizers.Tokenizer.from_file(str(path))
    for text in ["a a", "aab", "ccc a dd", "cc\u00e9\u00e9b", "  ", "b c b"]:
        # No post_processor and no <s>/</s>: no specials, as in tokenizers.
        assert ours.encode(text).tolist() == reference.encode(text).ids
    assert ours.tokenize("xyz a") == ["\u2581", "<unk>", "\u2581a"]  # unknowns fused into one


def _set(path: str, value):
    def mutate(doc: dict) -> None:
        *parents, last = path.split(".")
        node = doc
        for key in parents:
            node = node[int(key)] if isinstance(node, list) else node[key]
        node[last] = value
    return mutate


BAD_FILES = {
    "bpe_model": (_set("model", {"type": "BPE", "vocab": {}, "merges": []}), "model.type"),
    # WordPiece loads natively, but only behind BERT's pre-tokenizer (not Metaspace).
    "wordpiece_model": (_set("model", {"type": "WordPiece", "vocab": {"a": 0}, "unk_token": "a"}),
                        "pre_tokenizer.type"),
    "byte_fallback": (_set("model.byte_fallback", True), "model.byte_fallback"),
    "no_unk_id": (_set("model.unk_id", None), "model.unk_id"),
    "nfkc_normalizer": (_set("normalizer", {"type": "NFKC"}), "normalizer.type"),
    "lowercase_in_sequence": (_set("normalizer", sequence(STRIP_BOTH, {"type": "Lowercase"})),
                              "normalizer.normalizers[1].type"),
    "regex_class_replace": (_set("normalizer", {"type": "Replace", "pattern": {"Regex": "\\s+"},
                                                "content": " "}), "normalizer.pattern.Regex"),
    "regex_alternation_replace": (_set("normalizer", {"type": "Replace", "pattern": {"Regex": "a|b"},
                                                      "content": ""}), "normalizer.pattern.Regex"),
    "bytelevel_pre_tokenizer": (_set("pre_tokenizer", {"type": "ByteLevel"}), "pre_tokenizer.type"),
    "whitespace_split_alone": (_set("pre_tokenizer", {"type": "Sequence",
                                                      "pretokenizers": [{"type": "WhitespaceSplit"}]}),
                               "pre_tokenizer.pretokenizers"),
    "no_pre_tokenizer": (_set("pre_tokenizer", None), "pre_tokenizer"),
    "two_char_replacement": (_set("pre_tokenizer.replacement", "ab"), "pre_tokenizer.replacement"),
    "contradicting_prefix_flags": (_set("pre_tokenizer.add_prefix_space", False),
                                   "pre_tokenizer.add_prefix_space"),
    "non_special_added_token": (_set("added_tokens.0.special", False), "added_tokens[0].special"),
    "byte_level_post_processor": (_set("post_processor", {"type": "ByteLevel", "trim_offsets": True}),
                                  "post_processor.type"),
}


@pytest.mark.parametrize("name", sorted(BAD_FILES))
def test_unsupported_file_fails_at_load(name, tmp_path, tokenizer_cache_dir):
    mutate, field = BAD_FILES[name]
    doc = minimal_doc()
    mutate(doc)
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(ModelLoadError) as caught:
        Tokenizer.from_file(path, cache_dir=tokenizer_cache_dir)
    message = str(caught.value)
    assert str(path) in message and f"field {field}:" in message
    assert "supported" in message


@pytest.mark.parametrize("entry", [["b"], ["b", True], [7, -9.0], "b", ["b", "-9.0"], ["b", -9.0, 0],
                                   ["b", None], {"b": -9.0}])
def test_a_malformed_vocab_entry_is_named_at_load(entry, tmp_path, tokenizer_cache_dir):
    # The fourth of five entries: the error names the first bad one, not just the list.
    doc = minimal_doc()
    doc["model"]["vocab"][3] = entry
    path = tmp_path / "tokenizer.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(ModelLoadError) as caught:
        Tokenizer.from_file(path, cache_dir=tokenizer_cache_dir)
    assert "field model.vocab[3]: expected [piece (string), score (number)]" in str(caught.value)


def test_integer_scores_load_as_numbers(tmp_path, tokenizer_cache_dir):
    doc = minimal_doc()
    doc["model"]["vocab"] = [[piece, int(score)] for piece, score in doc["model"]["vocab"]]
    path = tmp_path / "tokenizer.json"
    path.write_text(json.dumps(doc))
    ours = Tokenizer.from_file(path, cache_dir=tokenizer_cache_dir)
    assert ours.spec.scores.tolist() == [0.0, -1.0, -2.0, -3.0, -9.0]
    assert ours.encode("a b").tolist() == tokenizers.Tokenizer.from_file(str(path)).encode("a b").ids


@pytest.mark.parametrize("content", [b'{"model": ', b'{"model": NaN}', b'{"model": "\\ud800"}',
                                     b'{"model": "\xff"}'])
def test_broken_json_fails_at_load(tmp_path, content):
    # Truncated, NaN, a lone surrogate, bytes that are not UTF-8: none of them loads in
    # `tokenizers` either (checked here), and each is a clear ModelLoadError.
    path = tmp_path / "tokenizer.json"
    path.write_bytes(content)
    with pytest.raises(Exception):  # noqa: B017 (tokenizers raises a bare Exception)
        tokenizers.Tokenizer.from_file(str(path))
    with pytest.raises(ModelLoadError, match="cannot read tokenizer.json"):
        Tokenizer.from_file(path)
