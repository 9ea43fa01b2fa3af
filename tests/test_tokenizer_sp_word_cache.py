"""sentencepiece mode's per-word cache (kernels/viterbi.py) changes no token: ids equal
sentencepiece==0.2.3 with the cache on, also where float32 rounding after a long prefix
decides a word differently than at the start of a text.

The near-tie model is written here: after ``▁a`` (score -1 + 0.52u) and ``b``
(-2 + 0.52u), u = 2^-12, the word ``▁ab`` (-3 + 1.44u) wins by 0.4u at the start of a
text, but after a path score of about -3000 (where float32's step is u) the two
additions of ``▁a`` + ``b`` round up by u in all while ``▁ab``'s one rounds down, and
sentencepiece picks ``▁a`` ``b``. A cache that reused the first answer would differ.
"""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import pytest
import sentencepiece
from sentencepiece import sentencepiece_model_pb2 as model_pb2

from conftest import shared_file
from embedserve.tokenizer import Tokenizer
from embedserve.tokenizer.kernels.word_cache import WAYS, cached_word_count
from tokenizer_corpus import assert_ids_equal, udhr_texts

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

STEP = 2.0 ** -12  # float32's spacing for magnitudes in [2048, 4096)
NEAR_TIE = [("\u2581", -6.0), ("a", -6.0), ("b", -2.0 + 532 / 1024 * STEP), ("c", -6.0),
            ("\u2581a", -1.0 + 532 / 1024 * STEP), ("\u2581ab", -3.0 + 1474 / 1024 * STEP), ("\u2581c", -1.0),
            ("\u2581abc", -5.0)]
# A word costing 25 takes a text's path score past -1e5 in 4,000 words (sentencepiece
# rebases there); its larger scores widen every word's rounding bound.
REBASE = NEAR_TIE + [("d", -6.0), ("\u2581d", -25.0)]


def write_model(path: Path, pieces: list[tuple[str, float]]) -> Path:
    """A Unigram .model of <unk>, <s>, </s> and ``pieces`` (NORMAL), identity normalizer."""
    kinds = model_pb2.ModelProto.SentencePiece
    model = model_pb2.ModelProto()
    for piece, score, kind in [("<unk>", 0.0, kinds.UNKNOWN), ("<s>", 0.0, kinds.CONTROL),
                               ("</s>", 0.0, kinds.CONTROL), *((p, s, kinds.NORMAL) for p, s in pieces)]:
        assert float(np.float32(score)) == score  # the test's arithmetic is float32's
        entry = model.pieces.add()
        entry.piece, entry.score, entry.type = piece, score, kind
    trainer = model.trainer_spec
    trainer.model_type = model_pb2.TrainerSpec.UNIGRAM
    trainer.vocab_size = len(model.pieces)
    trainer.unk_id, trainer.bos_id, trainer.eos_id, trainer.pad_id = 0, 1, 2, -1
    normalizer = model.normalizer_spec
    normalizer.name = "identity"
    normalizer.add_dummy_prefix = normalizer.remove_extra_whitespaces = normalizer.escape_whitespaces = True
    path.write_bytes(model.SerializeToString())
    return path


@pytest.fixture(scope="module")
def near_tie(tmp_path_factory) -> tuple[Path, sentencepiece.SentencePieceProcessor]:
    path = write_model(tmp_path_factory.mktemp("sp") / "near_tie.model", NEAR_TIE)
    return path, sentencepiece.SentencePieceProcessor(model_file=str(path))


@pytest.fixture(scope="module")
def rebase(tmp_path_factory) -> tuple[Path, sentencepiece.SentencePieceProcessor]:
    path = write_model(tmp_path_factory.mktemp("sp") / "rebase.model", REBASE)
    return path, sentencepiece.SentencePieceProcessor(model_file=str(path))


def ours(path: Path, slots: int = 1 << 16) -> Tokenizer:
    # Never skipped (word_cache_min_hit_percent=0): every text goes through the table.
    return Tokenizer.from_file(path, compat="sentencepiece", cache_dir=None, word_cache_slots=slots,
                               word_cache_min_hit_percent=0)


def test_a_word_decided_by_rounding_after_a_long_prefix(near_tie):
    path, reference = near_tie
    tokenizer = ours(path)
    assert tokenizer._word_cache_slots > 0  # this model's words chain: the cache is on
    text = "ab" + " c" * 3000 + " ab"
    pieces = reference.encode(text, out_type=str)
    assert pieces[0] == "\u2581ab" and pieces[-2:] == ["\u2581a", "b"]  # the same word, two answers
    assert tokenizer.encode("ab", add_special_tokens=False).tolist() == reference.encode("ab")
    assert cached_word_count(tokenizer._word_cache()) == 1  # "▁ab" is cached, and used again below
    for _ in range(2):  # the second time every word is in the cache
        assert tokenizer.encode(text, add_special_tokens=False).tolist() == reference.encode(text)
    batch = tokenizer.encode_batch(["ab", text, "ab ab"], add_special_tokens=False)
    assert_ids_equal(["ab", text, "ab ab"], batch, [reference.encode(t) for t in ["ab", text, "ab ab"]])


@pytest.mark.parametrize("model", ["near_tie", "rebase"])
@pytest.mark.parametrize("slots", [1 << 16, WAYS])
def test_random_word_sequences(request, model, slots):
    """Texts of 1 to 8,000 words, so ``▁ab`` comes at many path scores (both answers
    occur); with the rebase model the longest pass -1e5, where sentencepiece rebases."""
    path, reference = request.getfixturevalue(model)
    tokenizer = ours(path, slots)
    rng = random.Random(14)
    words = ["ab", "c", "d", "abc", "a", "b", "ba", "dd", "cab", "x"]
    texts = [" ".join(rng.choice(words) for _ in range(n)) for n in (1, 2, 5, 40, 300, 2000, 5000, 8000)]
    texts += [" ".join(["d"] * 4100 + ["ab", "c", "ab"] * 50)]  # past the rebase, then near ties
    expected = [reference.encode(t) for t in texts]
    pieces = [p for t in texts for p in reference.encode(t, out_type=str)]
    pairs = set(zip(pieces, pieces[1:]))
    assert "\u2581ab" in pieces and ("\u2581a", "b") in pairs  # the word's two answers both occur
    for order in (texts, texts[::-1]):
        for text in order:
            assert tokenizer.encode(text, add_special_tokens=False).tolist() == expected[texts.index(text)]
        assert_ids_equal(order, tokenizer.encode_batch(order, add_special_tokens=False),
                         [expected[texts.index(t)] for t in order])


def test_models_whose_pieces_span_a_word_start_do_not_cache(tmp_path):
    """A piece with "▁" past its first character, or no "▁" piece: the text does not fall
    into words at each "▁", so sentencepiece mode runs without the cache (same ids)."""
    for name, pieces in (("inner", NEAR_TIE + [("c\u2581ab", -4.0)]),
                         ("no_space_piece", [p for p in NEAR_TIE if p[0] != "\u2581"])):
        path = write_model(tmp_path / f"{name}.model", pieces)
        reference = sentencepiece.SentencePieceProcessor(model_file=str(path))
        tokenizer = ours(path)
        assert tokenizer._word_cache_slots == 0
        text = "ab c ab" + " c" * 3000 + " ab cab"
        assert tokenizer.encode(text, add_special_tokens=False).tolist() == reference.encode(text)


def test_udhr_in_a_thrashing_table(tokenizer_cache_dir, xlmr_sp_reference):
    """XLM-R's model on the first 1,500 characters of each UDHR text, in a table of one
    four-slot set (words keep evicting each other's records) and a full-size one, twice."""
    model = shared_file("xlmr/sentencepiece.bpe.model")
    texts = [t[:1500] for t in udhr_texts()]
    expected = [xlmr_sp_reference.encode(t) for t in texts]
    for slots in (WAYS, 1 << 16):
        tokenizer = Tokenizer.from_file(model, compat="sentencepiece", cache_dir=tokenizer_cache_dir,
                                        word_cache_slots=slots, word_cache_min_hit_percent=0)
        for _ in range(2):
            assert_ids_equal(texts, tokenizer.encode_batch(texts, add_special_tokens=False), expected)
            for text, ids in list(zip(texts, expected))[::5]:
                assert tokenizer.encode(text, add_special_tokens=False).tolist() == ids


def test_words_are_cut_at_every_metaspace_the_skipping_search_passes():
    """split_at_metaspace skips ahead by the byte where a "▁" would end; on strings of
    the pattern's own bytes (where a wrong skip would pass one over) its words are the
    cuts at every "▁" after the first byte, found one position at a time."""
    from embedserve.tokenizer.kernels.normalize_sp import split_at_metaspace
    metaspace = "\u2581".encode()
    rng = random.Random(41)
    for _ in range(3000):
        text = bytes(rng.choice([0xE2, 0x96, 0x81, 0x61]) for _ in range(rng.randrange(41)))
        cuts, i = [], 1
        while i + 3 <= len(text):
            if text[i:i + 3] == metaspace:
                cuts.append(i)
                i += 3
            else:
                i += 1
        bounds = [0, *cuts, len(text)]
        expected = [[a, b] for a, b in zip(bounds, bounds[1:])] if text else []
        words = np.zeros((len(text) + 2, 2), np.int32)
        count = split_at_metaspace(np.frombuffer(text, np.uint8), len(text), words)
        assert words[:count].tolist() == expected, text.hex()
