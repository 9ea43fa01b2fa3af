"""compat="sentencepiece" character offsets equal sentencepiece==0.2.3's piece ``begin``/``end``.

sentencepiece's pieces tile the text: a piece ends where the next begins, so a control
the charsmap deletes and the spaces of a run written as one "▁" belong to the piece
before them, and the last piece ends where normalization stopped consuming the text (the
first stripped trailing space, else the end). Before that rule, a "▁" piece of its own
for a run of spaces ended after its first space, and a piece before a deleted control
ended before it. The reference's byte offsets are turned into characters here (byte
fallback's pieces: test_tokenizer_sp_user_bytes.py).

The project-made XLM-R sentencepiece model (every checkout has it), and XLM-R's own on the
UDHR and emoji lines where the reference data is present.
"""

from __future__ import annotations

import pytest

from embedserve.tokenizer import Tokenizer
from test_tokenizer_sp_parity import PLAIN_RUN_EDGES
from tokenizer_corpus import BLOCK_BREAKERS, block_edge_texts, emoji_lines, udhr_lines

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

TILING = ["Hello  wor", "ab\x01cd", "ab\x7f", "x\x01", "ab\x01  ", "ab \x01", "a\x01 b", "\u041f\u043e\u043c\u043e"
          "\u0449\u044c\x01\x01\u043c\u0438\u0440", "\ufb01\x01x \ufb01", "  lead  and trail  ", "\x01", " ", "",
          "t\u00e3rro", "ta\u0303rro", "\uff76\u0301x", "\u337fa"]


def reference_offsets(reference, texts: list[str]) -> list[list[list[int]]]:
    """sentencepiece's pieces' [begin, end) of each text, as characters of the text."""
    out = []
    for text in texts:
        data = text.encode("utf-8")
        chars = {len(data): len(text)}
        at = 0
        for index, char in enumerate(text):
            chars[at] = index
            at += len(char.encode("utf-8"))
        out.append([[chars[p.begin], chars[p.end]] for p in reference.encode(text, return_type="proto").pieces])
    return out


def assert_offsets_equal(tokenizer: Tokenizer, reference, texts: list[str]) -> None:
    batch = tokenizer.encode_batch(texts, add_special_tokens=False, return_offsets=True)
    assert [batch.sequence(i).tolist() for i in range(len(texts))] == reference.encode(texts)
    expected = reference_offsets(reference, texts)
    differ = [(texts[i], batch.sequence_offsets(i).tolist(), expected[i]) for i in range(len(texts))
              if batch.sequence_offsets(i).tolist() != expected[i]]
    assert not differ, f"{len(differ)} of {len(texts)} differ, e.g. {differ[:2]}"


def test_pieces_tile_the_text_as_sentencepiece_gives_them(default_sp_tokenizer, default_sp_reference):
    assert_offsets_equal(default_sp_tokenizer, default_sp_reference, TILING)


def test_run_edges_give_sentencepiece_offsets(default_sp_tokenizer, default_sp_reference):
    texts = PLAIN_RUN_EDGES + [a + b for a in PLAIN_RUN_EDGES for b in PLAIN_RUN_EDGES] \
        + block_edge_texts(BLOCK_BREAKERS)
    assert_offsets_equal(default_sp_tokenizer, default_sp_reference, texts)


def test_udhr_and_emoji_lines_give_sentencepiece_offsets(xlmr_sp_tokenizer, xlmr_sp_reference):
    assert_offsets_equal(xlmr_sp_tokenizer, xlmr_sp_reference, udhr_lines()[::4] + emoji_lines()[::2] + TILING)
