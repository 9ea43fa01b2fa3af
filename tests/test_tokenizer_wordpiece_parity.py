"""Native WordPiece equals tokenizers==0.23.3 loading the same tokenizer.json: ids, segment
ids and character offsets, for single texts, pairs and truncation from either side.

References: all-MiniLM-L6-v2's tokenizer.json (from the all_minilm_l6_v2 package) and
WordPiece vocabularies trained here by tokenizers' WordPieceTrainer, one per
BertNormalizer switch flipped. The reference never pads or truncates unless the test
asks (the MiniLM file pads to 128 and cuts at 128).

As in the Unigram suites, text that spells a special token (``[CLS]``, ``[SEP]``, ...)
stays plain text here, while tokenizers splits it out as that special's id: such
texts are left out of the comparison and the chosen behaviour has its own test.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import tokenizers
from hypothesis import strategies as st

from conftest import python_docs_text, shared_file
from embedserve.tokenizer import Tokenizer
from tokenizer_corpus import HYPOTHESIS_TEXT, WHITESPACE, emoji_lines, seeded_strings, udhr_lines, udhr_texts

SPECIAL_TEXTS = ("[CLS]", "[SEP]", "[PAD]", "[MASK]", "[UNK]")
# What BERT's normalizer and pre-tokenizer treat specially, to mix into generated text.
_BERT_PIECES = st.one_of(
    st.text(st.characters(min_codepoint=0x4E00, max_codepoint=0x4E40), min_size=1, max_size=4),  # CJK
    st.sampled_from(["\uf900\uf901", "\U00020000\U0002a6df", "\u3400", "\U0002f800"]),
    st.sampled_from(["Crème Brûlée", "e\u0301", "A\u030a", "\u1ec7", "e\u0302\u0323", "a\u0301\u0323b",
                     "\u0344\u0323", "x\U0001d165\u0301y", "\u0301\U0001d165", "\U0001d15f\U0001d16d",
                     "\u0f73\u0f71", "\u1100\u1161\u11a8\uac00\ud7a3", "\u0130stanbul", "\u03a3\u03a3",
                     "\u01c5\u01c4\u1e9e\ufb01", "\u212b\u2126\u00c5"]),
    st.text(st.sampled_from("!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~\u00a1\u00bf\u2014\u2026\u3001\u3002\uff01\u00a7"),
            min_size=1, max_size=3),
    st.text(st.sampled_from("\x00\x01\x07\x1f\x7f\x85\u200b\u200d\u2060\ufeff\ufffd\ue000\U000e0001"),
            min_size=1, max_size=2),
    st.text(st.sampled_from(WHITESPACE), min_size=1, max_size=3),
    st.text(st.characters(categories=("Lu", "Ll", "Lt", "Mn", "Mc", "Po", "Sm", "So")), max_size=6),
    st.sampled_from(["##", "##ing", "un##able", "[UNK", "CLS]"]),
    st.tuples(st.sampled_from(["ab", "é", "中", "x\u0301", "\U0001f600"]), st.integers(40, 130)).map(
        lambda t: t[0] * t[1]),  # words around max_input_chars_per_word (100)
)
BERT_TEXT = st.lists(st.one_of(_BERT_PIECES, HYPOTHESIS_TEXT), max_size=6).map(" ".join)


def plain(text: str) -> bool:
    return not any(special in text for special in SPECIAL_TEXTS)


def reference_of(path: Path) -> tokenizers.Tokenizer:
    reference = tokenizers.Tokenizer.from_file(str(path))
    reference.no_padding()
    reference.no_truncation()
    return reference


def assert_same(ours: Tokenizer, reference: tokenizers.Tokenizer, texts: list[str]) -> None:
    """ids, segment ids (all zero for single texts) and offsets of every text."""
    texts = [t for t in texts if plain(t)]
    got = ours.encode_batch(texts, return_offsets=True)
    assert got.token_type_ids is None
    expected = reference.encode_batch(texts)  # (encode_batch_fast leaves offsets out)
    bad = [i for i, e in enumerate(expected)
           if got.sequence(i).tolist() != e.ids or got.sequence_offsets(i).tolist() != [list(o) for o in e.offsets]
           or any(e.type_ids)]
    detail = [(texts[i][:60], got.sequence(i)[:12].tolist(), expected[i].ids[:12],
               got.sequence_offsets(i)[:6].tolist(), expected[i].offsets[:6]) for i in bad[:3]]
    assert not bad, f"{len(bad)} of {len(texts)} differ, e.g. {detail}"


def assert_same_pairs(ours: Tokenizer, reference: tokenizers.Tokenizer, query: str, docs: list[str],
                      max_length: int | None = None, side: str | None = None) -> None:
    docs = [d for d in docs if plain(d)]
    got = ours.encode_pairs(query, docs, max_length=max_length, truncation=side, return_offsets=True)
    if side is not None:
        reference.enable_truncation(max_length, strategy="longest_first", direction=side)
    try:
        expected = reference.encode_batch([(query, d) for d in docs])
    finally:
        reference.no_truncation()
    assert got.token_type_ids is not None
    for i, e in enumerate(expected):
        lo, hi = got.cu_seqlens[i], got.cu_seqlens[i + 1]
        assert got.sequence(i).tolist() == e.ids, (query, docs[i])
        assert got.token_type_ids[lo:hi].tolist() == e.type_ids, (query, docs[i])
        assert got.sequence_offsets(i).tolist() == [list(o) for o in e.offsets], (query, docs[i])


def doc_lines() -> list[str]:
    return [line for line in python_docs_text().split("\n") if line.strip()]


# ---- all-MiniLM-L6-v2 -----------------------------------------------------------------
@pytest.fixture(scope="module")
def minilm(minilm_dir, tokenizer_cache_dir) -> tuple[Tokenizer, tokenizers.Tokenizer]:
    path = minilm_dir / "tokenizer.json"
    return Tokenizer.from_file(path, cache_dir=tokenizer_cache_dir), reference_of(path)


def test_minilm_is_native_wordpiece(minilm):
    ours, reference = minilm
    assert ours.backend == "native-wordpiece"
    assert ours.encode("Hello, World!").tolist() == [101, 7592, 1010, 2088, 999, 102]
    text = "unaffable tokenization"
    assert ours.tokenize(text) == reference.encode(text, add_special_tokens=False).tokens
    assert ours.tokenize(text)[:3] == ["una", "##ffa", "##ble"]


def test_minilm_python_docs(minilm):
    lines = doc_lines()
    assert len(lines) > 5000
    assert_same(*minilm, lines + ["\n".join(lines[i:i + 40]) for i in range(0, 2000, 40)])


def test_minilm_hypothesis_strings(minilm):
    texts = seeded_strings(5_000) + seeded_strings(5_000, BERT_TEXT)
    assert len(texts) >= 10_000
    assert_same(*minilm, texts)


def test_minilm_long_words(minilm):
    # max_input_chars_per_word is 100 characters (not bytes) of the normalized word.
    words = [c * n for c in ("a", "é", "E\u0301", "中", "\U0001f600", "ab") for n in (99, 100, 101, 150)]
    assert_same(*minilm, words + [" ".join(words), "x " + "y" * 101 + " z", "q" * 100 + "," + "r" * 3])
    ours, _ = minilm
    assert ours.encode("a" * 101, add_special_tokens=False).tolist() == [ours.unk_id]


def test_minilm_pairs_and_truncation(minilm):
    ours, reference = minilm
    query = "How do I open a file in Python?"
    docs = doc_lines()[:300:3] + seeded_strings(200, BERT_TEXT)
    assert_same_pairs(ours, reference, query, docs)
    for side in ("right", "left"):
        for max_length in (3, 8, 24, 128):
            assert_same_pairs(ours, reference, query, docs[:60], max_length, side)
            reference.enable_truncation(max_length, direction=side)
            try:
                expected = reference.encode_batch(docs[:60])
            finally:
                reference.no_truncation()
            got = ours.encode_batch(docs[:60], max_length=max_length, truncation=side, return_offsets=True)
            for i, e in enumerate(expected):
                assert got.sequence(i).tolist() == e.ids
                assert got.sequence_offsets(i).tolist() == [list(o) for o in e.offsets]


def test_special_token_text_is_plain_text(minilm):
    """Ours: "[CLS]" in user text is characters, never the control id; tokenizers differs."""
    ours, reference = minilm
    text = "a [CLS] b [SEP] [MASK]"
    ids = ours.encode(text, add_special_tokens=False).tolist()
    assert not {101, 102, 103} & set(ids)
    assert ids == reference.encode("a [ CLS ] b [ SEP ] [ MASK ]", add_special_tokens=False).ids
    assert {101, 102, 103} <= set(reference.encode(text).ids[1:-1])


# ---- trained vocabularies, one normalizer switch flipped each ---------------------------
NORMALIZER_CASES = {
    "default": dict(clean_text=True, handle_chinese_chars=True, strip_accents=None, lowercase=True),
    "cased": dict(clean_text=True, handle_chinese_chars=True, strip_accents=None, lowercase=False),
    "cased_strip_accents": dict(clean_text=True, handle_chinese_chars=True, strip_accents=True, lowercase=False),
    "lower_keep_accents": dict(clean_text=True, handle_chinese_chars=True, strip_accents=False, lowercase=True),
    "no_chinese": dict(clean_text=True, handle_chinese_chars=False, strip_accents=None, lowercase=True),
    "no_clean_text": dict(clean_text=False, handle_chinese_chars=True, strip_accents=None, lowercase=True),
    "no_normalizer": None,
}


def train_wordpiece(path: Path, normalizer: dict | None, corpus: list[str]) -> Path:
    """A WordPiece tokenizer.json trained by tokenizers on ``corpus``, BERT-shaped."""
    from tokenizers import models, normalizers, pre_tokenizers, processors, trainers

    tokenizer = tokenizers.Tokenizer(models.WordPiece(unk_token="[UNK]", max_input_chars_per_word=40))
    if normalizer is not None:
        tokenizer.normalizer = normalizers.BertNormalizer(**normalizer)
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    tokenizer.train_from_iterator(corpus, trainers.WordPieceTrainer(vocab_size=3000, special_tokens=specials,
                                                                    show_progress=False))
    tokenizer.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", tokenizer.token_to_id("[CLS]")), ("[SEP]", tokenizer.token_to_id("[SEP]"))])
    tokenizer.save(str(path))
    assert json.loads(path.read_text())["model"]["type"] == "WordPiece"
    return path


@pytest.fixture(scope="module")
def trained_corpus() -> list[str]:
    from tokenizer_corpus import SCRIPTS

    return doc_lines()[::4] + SCRIPTS * 20 + seeded_strings(1_000, BERT_TEXT)


@pytest.mark.parametrize("case", NORMALIZER_CASES)
def test_trained_vocabulary(case, trained_corpus, tmp_path, tokenizer_cache_dir):
    path = train_wordpiece(tmp_path / "tokenizer.json", NORMALIZER_CASES[case], trained_corpus)
    ours, reference = Tokenizer.from_file(path, cache_dir=tokenizer_cache_dir), reference_of(path)
    texts = doc_lines()[1::7] + seeded_strings(1_000, BERT_TEXT) + seeded_strings(1_000)
    assert_same(ours, reference, texts)
    assert_same_pairs(ours, reference, "Crème brûlée 中文?", texts[:50], 32, "left")


# ---- the reference corpora (skip without ../shared/data) --------------------------------
def test_minilm_udhr_lines_and_whole_texts(minilm):
    lines, texts = udhr_lines(), list(udhr_texts())
    assert len(lines) == 35870 and len(texts) == 388
    assert_same(*minilm, lines + texts)


def test_minilm_emoji_and_botchan(minilm):
    botchan = shared_file("text/botchan.txt").read_text(encoding="utf-8")
    paragraphs = [p for p in botchan.split("\n\n") if p.strip()]
    assert_same(*minilm, emoji_lines() + paragraphs + [botchan])
