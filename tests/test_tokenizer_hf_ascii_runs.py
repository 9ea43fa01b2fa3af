"""hf mode's ASCII copy loops (Precompiled and the pre-tokenizer) against tokenizers.

Both loops copy runs of plain ASCII and must hand over to the general path exactly
where it would act differently: at whitespace, at an ASCII Metaspace replacement
(a new word starts there with ``split``), at a character that joins the next one in
a grapheme cluster, at a charsmap rule. The vocabulary has a piece that crosses the
replacement (``a_b``), so a missed word split changes the ids.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import tokenizers

from conftest import shared_file
from embedserve.tokenizer import Tokenizer
from tokenizer_corpus import BLOCK_BREAKERS, block_edge_texts

TEXTS = ["a_b", "xa_b_a", "a_b a_b", "ab\tab", "ab\r\nab", "ae\u0301a_b", "a\u0301_b", "ab\x00a_b",
         "a\u00a0b", "ab  ba", "ＡＢ a_b", "x" * 40 + "_b"]
# The loops copy printable ASCII 8 bytes at a time; "_" is this test's replacement.
BLOCK_TEXTS = block_edge_texts(["_", *BLOCK_BREAKERS])


def tiny_tokenizer_json(replacement: str, charsmap_source: Path) -> dict:
    charsmap_step = json.loads(charsmap_source.read_text(encoding="utf-8"))["normalizer"]
    pieces = [["<unk>", 0.0], ["a_b", -0.5], [replacement + "a", -1.0], [replacement, -3.0], ["a", -2.0],
              ["b", -2.0], ["x", -2.0], ["e", -2.0], ["ab", -1.5]]
    return {
        "version": "1.0", "truncation": None, "padding": None,
        "added_tokens": [{"id": 0, "content": "<unk>", "single_word": False, "lstrip": False,
                          "rstrip": False, "normalized": False, "special": True}],
        "normalizer": charsmap_step,
        "pre_tokenizer": {"type": "Metaspace", "replacement": replacement, "prepend_scheme": "always",
                          "split": True},
        "post_processor": None, "decoder": None,
        "model": {"type": "Unigram", "unk_id": 0, "byte_fallback": False, "vocab": pieces},
    }


@pytest.mark.parametrize("charsmap", ["project", "xlmr/tokenizer.json"])
@pytest.mark.parametrize("replacement", ["_", "\u2581"])
def test_ascii_runs_match_tokenizers(replacement, charsmap, tmp_path, xlmr_tokenizer_dir):
    # The normalizer (charsmap) of the project-made XLM-R tokenizer.json, and of XLM-R's own.
    source = xlmr_tokenizer_dir / "tokenizer.json" if charsmap == "project" else shared_file(charsmap)
    path = tmp_path / "tokenizer.json"
    path.write_text(json.dumps(tiny_tokenizer_json(replacement, source)), encoding="utf-8")
    ours = Tokenizer.from_file(path, cache_dir=None)
    reference = tokenizers.Tokenizer.from_file(str(path))
    got = {text: ours.encode(text).tolist() for text in TEXTS + BLOCK_TEXTS}
    expected = {text: reference.encode(text).ids for text in TEXTS + BLOCK_TEXTS}
    assert got == expected
    # The run kernel keeps the source offsets: another compile of both loops.
    batch = ours.encode_batch(BLOCK_TEXTS, return_offsets=True)
    assert [batch.sequence(i).tolist() for i in range(len(BLOCK_TEXTS))] == [expected[t] for t in BLOCK_TEXTS]
    assert any(1 in ids for ids in expected.values()) == (replacement == "\u2581")  # a_b used only unsplit
