"""The bulk benchmark's corpora (bench/bulk_corpus.py): mixed lengths from the reference data.

Checks what the benchmark's figures rely on: the mix really mixes the two
sources in the stated proportion and order, the short corpus is short, and
corpora larger than the sources repeat them instead of coming out short.
"""

from __future__ import annotations

import json

from bench import bulk_corpus
from bench.reference_data import read_xquad
from conftest import shared_file


def test_mixed_corpus_puts_an_xquad_paragraph_in_every_fifth_document(tmp_path):
    data_dir = shared_file("text/udhr2").parents[1]
    texts = bulk_corpus.mixed(data_dir, 50)
    paragraphs = set()
    for path in bulk_corpus.xquad_files(data_dir):
        paragraphs.update(read_xquad(path)[0])
    assert len(texts) == 50
    assert [i for i, t in enumerate(texts) if t in paragraphs] == list(range(4, 50, 5))
    lines = bulk_corpus.udhr_lines(data_dir, 40)
    assert [t for t in texts if t not in paragraphs] == lines
    source = bulk_corpus.write_jsonl(tmp_path / "c.jsonl", texts)
    assert [json.loads(line)["text"] for line in source.read_text().splitlines()] == texts


def test_short_corpus_is_one_word_documents_and_large_corpora_repeat_the_source():
    data_dir = shared_file("text/udhr2").parents[1]
    texts = bulk_corpus.short(data_dir, 1000)
    assert len(texts) == 1000 and all(t and " " not in t for t in texts)
    assert max(map(len, texts)) <= 3 * bulk_corpus.SHORT_CHARS
    available = sum(1 for path in bulk_corpus.udhr_dir(data_dir).glob("*.txt")
                    for line in path.read_text(errors="replace").splitlines() if line.strip())
    lines = bulk_corpus.udhr_lines(data_dir, available + 5)
    assert len(lines) == available + 5 and len(set(lines[:available])) > available // 2
    assert lines[available:] == lines[:5]
