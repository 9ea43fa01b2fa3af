"""The hf-mode per-word cache (kernels/word_cache.py) changes no token: ids equal
tokenizers==0.23.3 with the cache cold, hot, thrashing in a table of one four-slot set, and shared by
threads; offsets equal those of the same tokenizer with the cache off (whose offsets
test_tokenizer_api.py checks against the source text). The table never grows.
sentencepiece mode's cache: test_tokenizer_sp_word_cache.py.

Texts: the first 1,500 characters of each UDHR translation (../shared/data), so the
words cover many scripts, and words longer than the cache's bound (CJK runs, a long
made-up word) run through too.
"""

from __future__ import annotations

import random
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import tokenizers

from conftest import shared_file
from embedserve.tokenizer import Tokenizer
from embedserve.tokenizer.kernels.word_cache import MAX_WORD_BYTES, WAYS, cached_word_count
from tokenizer_corpus import assert_ids_equal, udhr_texts

LONG_WORDS = ["x" * (MAX_WORD_BYTES + 5) + " and " + "Grüße" * 10,
              "日本語のテキストは空白で区切られない長い単語になります"]


@pytest.fixture(scope="module")
def corpus() -> list[str]:
    return [t[:1500] for t in udhr_texts()] + LONG_WORDS


@pytest.fixture(scope="module")
def reference():
    return tokenizers.Tokenizer.from_file(str(shared_file("xlmr/tokenizer.json")))


@pytest.fixture(scope="module")
def expected(reference, corpus) -> dict[str, list[int]]:
    return {t: e.ids for t, e in zip(corpus, reference.encode_batch_fast(corpus))}


def ours(tokenizer_cache_dir, slots: int, min_hit_percent: int = 0) -> Tokenizer:
    """Never skipped by default (every text goes through the table, whatever it finds)."""
    return Tokenizer.from_file(shared_file("xlmr/tokenizer.json"), cache_dir=tokenizer_cache_dir,
                               word_cache_slots=slots, word_cache_min_hit_percent=min_hit_percent)


def check(tokenizer: Tokenizer, texts: list[str], expected: dict[str, list[int]], no_cache: Tokenizer) -> None:
    batch = tokenizer.encode_batch(texts, return_offsets=True)
    assert_ids_equal(texts, batch, [expected[t] for t in texts])
    off = no_cache.encode_batch(texts, return_offsets=True)
    assert np.array_equal(batch.offsets, off.offsets)
    for text in texts[::7]:  # the single-text kernel shares the cache
        assert tokenizer.encode(text).tolist() == expected[text]


@pytest.mark.parametrize("slots", [4096, WAYS])
def test_cold_then_hot_in_varied_order(tokenizer_cache_dir, corpus, expected, slots):
    """One set of four slots: almost every word evicts another, and lookups must verify."""
    tokenizer, no_cache = ours(tokenizer_cache_dir, slots), ours(tokenizer_cache_dir, 0)
    cache = tokenizer._word_cache()
    shuffled = corpus[:]
    random.Random(16).shuffle(shuffled)
    for texts in (corpus, corpus, corpus[::-1], shuffled):
        check(tokenizer, texts, expected, no_cache)
    assert cached_word_count(cache) > 0  # it did cache words
    tokenizer.clear_word_cache()
    assert cached_word_count(cache) == 0
    check(tokenizer, shuffled, expected, no_cache)  # cold again


def test_table_is_bounded(tokenizer_cache_dir, corpus, expected):
    tokenizer = Tokenizer(ours(tokenizer_cache_dir, 64).spec, cache_dir=tokenizer_cache_dir, threads=1,
                          word_cache_slots=64)  # one thread: the batch uses this thread's table
    cache = tokenizer._word_cache()
    sizes = [a.nbytes for a in cache]
    tokenizer.encode_batch(corpus)
    tokenizer.encode_batch(corpus[::-1])
    assert tokenizer._word_cache() is cache and [a.nbytes for a in cache] == sizes
    assert cache.records.shape[0] == 64 and ((cache.records[:, 0] & 0xFF) <= MAX_WORD_BYTES).all()
    assert 0 < cached_word_count(cache) <= 64


def test_threads_each_get_reference_output(tokenizer_cache_dir, corpus, expected):
    """Four threads on one instance, each text many times in different orders; and a
    batch big enough for encode_batch's own thread pool."""
    tokenizer = ours(tokenizer_cache_dir, 8)
    orders = [random.Random(seed).sample(corpus, len(corpus)) for seed in range(8)]

    def run(texts: list[str]) -> list[str]:
        return [t for t in texts if tokenizer.encode(t, add_special_tokens=False).tolist() != expected[t][1:-1]]

    with ThreadPoolExecutor(4) as pool:
        wrong = [t for bad in pool.map(run, orders) for t in bad]
    assert not wrong, f"{len(wrong)} texts differ, e.g. {wrong[:2]}"
    big = corpus * 3
    batch = Tokenizer(tokenizer.spec, cache_dir=tokenizer_cache_dir, threads=4, word_cache_slots=8).encode_batch(big)
    assert_ids_equal(big, batch, [expected[t] for t in big])


def test_capacity_must_be_a_power_of_two_of_at_least_a_set(tokenizer_cache_dir):
    for slots in (100, WAYS // 2):
        with pytest.raises(ValueError, match=f"power of two of at least {WAYS}"):
            ours(tokenizer_cache_dir, slots)


def test_words_of_one_set_stay_together(tokenizer_cache_dir, reference):
    """A table of one set keeps four words at once: encoding them again writes nothing
    (each is found, and gives the reference's ids), where a table of one slot per hash
    kept only the last."""
    tokenizer = ours(tokenizer_cache_dir, WAYS)
    text = "river stone cloud"  # three words, "▁river" "▁stone" "▁cloud", each a few tokens
    assert tokenizer.encode(text).tolist() == reference.encode(text).ids
    cache = tokenizer._word_cache()
    assert cached_word_count(cache) == 3
    records = cache.records.copy()
    assert tokenizer.encode(text).tolist() == reference.encode(text).ids
    assert (cache.records == records).all()
    tokenizer.encode("meadow")  # a fourth word takes the last empty slot, and evicts none
    kept = records[:, 0] != 0
    assert cached_word_count(cache) == 4 and (cache.records[kept] == records[kept]).all()


def test_prefetching_a_slot_reads_nothing_and_writes_nothing():
    # prefetch_slot (Viterbi calls it for the word 8 ahead) is a hint to the CPU: any word,
    # any table, the empty one included, and the table is left as it was.
    from embedserve.tokenizer.kernels.word_cache import new_word_cache, prefetch_slot
    text = np.frombuffer("▁Grüße ▁".encode() + b"x" * (MAX_WORD_BYTES + 1), np.uint8)
    for cache in (new_word_cache(0), new_word_cache(8)):
        cache.records[...] = 7
        before = cache.records.copy()
        for start, end in ((0, 9), (3, 3), (10, text.shape[0])):
            prefetch_slot(cache, text, start, end)
        assert (cache.records == before).all()


def test_a_table_that_finds_few_words_is_skipped_until_text_comes_again(tokenizer_cache_dir, corpus, expected):
    """UDHR texts seen once find under 60 % of their words' bytes in the table: after a
    window of probes, the other texts skip it (it stops filling), and the texts coming
    again find their words in the probes' records, so the table is used again; the ids
    equal tokenizers' throughout, encode() and encode_batch() alike."""
    skipping, always = ours(tokenizer_cache_dir, 1 << 16, 60), ours(tokenizer_cache_dir, 1 << 16)
    usage = skipping._thread_buffers(0).usage  # [0]: whether the table is skipped

    def skipped_share(texts: list[str]) -> float:
        skipped = 0
        for text in texts:
            assert skipping.encode(text).tolist() == expected[text]
            skipped += int(usage[0])
        return skipped / len(texts)

    assert skipped_share(corpus) > 0.5  # once each: the cache cannot pay here
    for text in corpus:
        always.encode(text)
    assert 0 < cached_word_count(skipping._word_cache()) < cached_word_count(always._word_cache()) / 2
    skipped_share(corpus)  # the same texts again: the probes find their words, the others fill the table
    assert skipped_share(corpus[::-1]) < 0.1
    assert_ids_equal(corpus, skipping.encode_batch(corpus), [expected[t] for t in corpus])
    assert cached_word_count(skipping._word_cache()) > cached_word_count(always._word_cache()) / 2
    skipping.clear_word_cache()
    assert usage[:3].tolist() == [0, 0, 0]


def test_min_hit_percent_is_a_percentage(tokenizer_cache_dir):
    for share in (-1, 101):
        with pytest.raises(ValueError, match="min_hit_percent"):
            ours(tokenizer_cache_dir, WAYS, share)
