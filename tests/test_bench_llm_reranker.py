"""``python -m bench llm_reranker`` in its smallest mode, and the helpers it shares with
``bench mpnet`` (bench/mixed_lengths.py).

The smoke run builds the hidden-256, one-layer model (``--tiny``) and scores 4 documents
on both sides: what it prints must be the two sides' scores agreeing (the model card's
score, within 1e-5) and one ratio row. Speed is never asserted.
"""

from __future__ import annotations

import re

import numpy as np

from bench.__main__ import main as bench_main
from bench.mixed_lengths import mixed_texts, speedup_table


def test_mixed_texts_have_the_asked_word_counts() -> None:
    texts = mixed_texts(200, np.random.default_rng(1), fewest=4, most=300)
    counts = [len(t.split()) for t in texts]
    assert len(texts) == 200 and min(counts) >= 4 and max(counts) <= 300
    assert max(counts) > 100 and min(counts) < 10          # spread over the range, not one length


def test_speedup_table_divides_the_reference_time_by_ours() -> None:
    row = speedup_table("mixed", 1000, 2.0, 5.0).splitlines()[-1]
    assert row == "| mixed | 1000 | 500 | 200 | 2.50x |"


def test_the_smallest_run_scores_as_the_reference_and_prints_a_ratio(capsys) -> None:
    assert bench_main(["llm_reranker", "--tiny", "--layers", "1", "--repeats", "1", "--documents", "4"]) == 0
    out = capsys.readouterr().out
    difference = float(re.search(r"max \|score difference\| (\S+)", out).group(1))
    assert difference <= 1e-5, out
    assert re.search(r"^\| mixed \| \d+ \| \d+ \| \d+ \| \d+\.\d\dx \|$", out, re.MULTILINE), out
