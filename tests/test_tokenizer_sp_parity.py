"""compat="sentencepiece" is token-for-token equal to sentencepiece==0.2.3.

On the issue's corpora (see tokenizer_corpus.py), for XLM-R's .model and both of
SentencePiece's own test models, plus 10,000 seeded hypothesis strings.
"""

from __future__ import annotations

import pytest
import sentencepiece
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import shared_file
from embedserve.tokenizer import Tokenizer
from tokenizer_corpus import (
    BLOCK_BREAKERS,
    HYPOTHESIS_TEXT,
    assert_ids_equal,
    block_edge_texts,
    emoji_lines,
    novel_chunks,
    udhr_lines,
    udhr_texts,
)

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


def assert_same(tokenizer: Tokenizer, reference, texts: list[str]) -> None:
    assert_ids_equal(texts, tokenizer.encode_batch(texts, add_special_tokens=False), reference.encode(texts))


def test_udhr_lines_and_whole_texts(xlmr_sp_tokenizer, xlmr_sp_reference):
    lines = udhr_lines()
    assert len(lines) == 35870 and len(udhr_texts()) == 388
    assert_same(xlmr_sp_tokenizer, xlmr_sp_reference, lines + list(udhr_texts()))


def test_emoji_lines(xlmr_sp_tokenizer, xlmr_sp_reference):
    assert_same(xlmr_sp_tokenizer, xlmr_sp_reference, emoji_lines())


def test_novels_in_512_4k_16k_token_chunks(xlmr_sp_tokenizer, xlmr_sp_reference):
    # The 16k-token chunks push float32 path scores past -1e5, where sentencepiece
    # rebases them (see viterbi.py); without the rebase one wagahaiwa chunk differs.
    chunks = novel_chunks(xlmr_sp_reference.encode, xlmr_sp_reference.decode)
    assert len(chunks) > 700
    assert_same(xlmr_sp_tokenizer, xlmr_sp_reference, chunks)


def test_single_encode_matches_batch_on_novel_chunks(xlmr_sp_tokenizer, xlmr_sp_reference):
    # The single-text kernel (encode) and the batch kernel must agree exactly.
    chunks = novel_chunks(xlmr_sp_reference.encode, xlmr_sp_reference.decode)[::7]
    batch = xlmr_sp_tokenizer.encode_batch(chunks, add_special_tokens=False)
    for i, chunk in enumerate(chunks):
        assert xlmr_sp_tokenizer.encode(chunk, add_special_tokens=False).tolist() == batch.sequence(i).tolist()


# normalize_sp copies runs of characters it can decide from its table alone in a tight
# loop (_copy_plain_run) and hands the rest to its general loop; these put every kind of
# hand-over (a rule, a 4-byte character, a longer charsmap key, leading/repeated/trailing
# spaces, the end of the text) at the edges of such runs, alone and joined in pairs.
PLAIN_RUN_EDGES = ["a", " a", "a ", "  a  b   c  ", "Hello  world", "ｆｕｌｌ width", "Пр ивет  мир", "日本語 テキスト",
                   "a😀b", "😀 😀", "x\u3000y", "ﬁne ﬂow", "end é", "é", "①②", "tab\tand\nnewline",
                   "\u00a0nbsp\u00a0", "ｶﾞｷﾞ", "e\u0301"]


def test_plain_runs_and_their_edges(xlmr_sp_tokenizer, xlmr_sp_reference):
    texts = PLAIN_RUN_EDGES + [a + b for a in PLAIN_RUN_EDGES for b in PLAIN_RUN_EDGES] \
        + block_edge_texts(BLOCK_BREAKERS)
    assert_same(xlmr_sp_tokenizer, xlmr_sp_reference, texts)
    for text in texts:  # the single-text kernel too
        assert xlmr_sp_tokenizer.encode(text, add_special_tokens=False).tolist() == xlmr_sp_reference.encode(text), text


@pytest.mark.parametrize("name", ["spm/test_model.model", "spm/test_ja_model.model"])
def test_sentencepiece_test_models(name, tokenizer_cache_dir):
    path = shared_file(name)
    tokenizer = Tokenizer.from_file(path, compat="sentencepiece", cache_dir=tokenizer_cache_dir)
    reference = sentencepiece.SentencePieceProcessor(model_file=str(path))
    texts = udhr_lines()[::3] + emoji_lines()[::3] + novel_chunks(reference.encode, reference.decode)[::4]
    assert_same(tokenizer, reference, texts)


HYPOTHESIS_EXAMPLES, STRINGS_PER_EXAMPLE = 500, 20  # 10,000 strings, compared in batches


@settings(max_examples=HYPOTHESIS_EXAMPLES, derandomize=True, database=None, deadline=None,
          suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_hypothesis_strings(data, xlmr_sp_tokenizer, xlmr_sp_reference):
    texts = [data.draw(HYPOTHESIS_TEXT) for _ in range(STRINGS_PER_EXAMPLE)]
    assert_same(xlmr_sp_tokenizer, xlmr_sp_reference, texts)
    for text in texts[:2]:  # and the single-text path
        assert xlmr_sp_tokenizer.encode(text, add_special_tokens=False).tolist() == xlmr_sp_reference.encode(text)
