"""A bounded per-word cache of Unigram Viterbi results, in fixed numpy arrays.

In hf mode each pre-tokenized word is its own Viterbi with scores from 0, so a word's
tokens (ids, and each token's end in bytes of the word) depend on its bytes only:
caching them is exact. sentencepiece mode runs one Viterbi over the whole text, but no
piece spans a "▁" other than its first (the Tokenizer checks the vocabulary), so the
text falls into words at each "▁", every path passes each word's start, and a word's
best path depends on the text before it only through the float32 path score there:
float32 rounding near a tie can decide differently after another prefix. A record
therefore also keeps the word's slack (``slack_of``): how much larger than its rounding
error the narrowest comparison of the word's Viterbi was, and a later lookup uses the
record only when its own rounding error cannot undo any comparison (viterbi.py).

The table is set-associative: a word's hash (``word_hash``) picks a set of ``WAYS`` adjacent
records, the word may sit in any of them, and each record keeps the word's bytes for
verification. A new word takes an empty record of its set, else the one its hash picks
(``claim_slot``). With one record per hash, two frequent words that share it evict each
other on every use: on the multilingual bench (~40k distinct words in 131,072 records),
after three passes, an 8 MiB table of single records held 88.5 % of the cacheable words
of a pass, of 4-record sets 98.6 % (BENCHMARKS.md, tokenizer section). Token ids must
fit 23 bits (the Tokenizer checks). Its size is fixed at construction (no growth, no
eviction bookkeeping); words longer than ``MAX_WORD_BYTES`` are not cached.

A table is not safe to share between threads (a reader could see a half-written
slot): the Tokenizer gives each thread its own.
"""

from __future__ import annotations

from typing import NamedTuple

import llvmlite.ir as ir
import numpy as np
from numba.core import cgutils, types
from numba.extending import intrinsic

from embedserve.tokenizer.huge_pages import huge_page_zeros
from embedserve.tokenizer.kernel_cache import cached_njit
from embedserve.tokenizer.kernels.swar import load_u64

MAX_WORD_BYTES = 24  # longer words skip the cache
WAYS = 4  # records per set: four adjacent cache lines, all loaded by one prefetch
# A record is one 64-byte cache line of ints: the header, the word (4 bytes an int),
# sentencepiece mode's slack (float32 bits), then the tokens. Twice as many of these in
# the same memory as 128-byte records held more hits than the 9th-24th token slots did
# (BENCHMARKS.md, tokenizer section); a word of more tokens is not cached.
_SLACK = 1 + MAX_WORD_BYTES // 4
_HEAD = _SLACK + 1
RECORD_INTS = 16
# 8 tokens a word, in both modes: sentencepiece mode's hit replays the path's float32
# additions with each token's score read from the model, not kept here (kept, they
# halved the tokens a record holds, and a fifth of the multilingual bench's text is in
# words of 5-8 tokens).
TOKEN_INTS = RECORD_INTS - _HEAD
_KEY_MASK = 0x7FFF00FF  # a header's length and tag: what a lookup compares first
_FNV_OFFSET = np.uint64(0xCBF29CE484222325)
_FNV_PRIME = np.uint64(0x100000001B3)


# Text that does not come again: a table that finds too few of the words it looks up
# costs more than its hits save (hashing, probing and storing every word). On the UDHR
# stream (each 512-token text once; about 40 % of the bytes of its words found) both
# modes ran 8-25 % slower with the table than without. So one text in PROBE_EVERY,
# picked by a hash of its first and last bytes (a text that comes again is picked again),
# counts the bytes of the words the table holds after it and of those it found there;
# at the end of each WINDOW_BYTES of them, below ``min_hit_percent`` found, every text
# but the probes skips the table (runs as if it had none) until a window finds enough
# again. The probes go on looking words up and storing them: text that comes again
# finds its words, and the table is used again one pass later.
WINDOW_BYTES = 2048
PROBE_EVERY = 16  # a power of two
MIN_HIT_PERCENT = 60
# Columns of a table's usage array (``new_table_usage``).
_U_SKIP, _U_LOOKED, _U_FOUND, _U_MIN_HIT = 0, 1, 2, 3
# What ``table_use`` answers: the text skips the table, uses it, or uses it and counts.
NO_TABLE, TABLE, PROBE = 0, 1, 2


def new_table_usage(min_hit_percent: int = MIN_HIT_PERCENT) -> np.ndarray:
    """The hit counts that decide whether a table is skipped (int64 [4]: skipped or not,
    the current window's bytes held and found, ``min_hit_percent``; 0: never skipped).

    An array of its own beside the table, not a WordCache field: every inlined helper
    that takes the table pays a reference count round trip per array in it, and a
    second array there made the warm table ~15 % slower."""
    if not 0 <= min_hit_percent <= 100:
        raise ValueError(f"word cache min_hit_percent {min_hit_percent}: expected 0-100")
    usage = np.zeros(4, np.int64)
    usage[_U_MIN_HIT] = min_hit_percent
    return usage


def clear_table_usage(usage: np.ndarray) -> None:
    """Forget the hit counts (a cleared table is used until a window says otherwise)."""
    usage[:_U_MIN_HIT] = 0


class WordCache(NamedTuple):
    # int32 [C, RECORD_INTS]: [0] the header, word length (0: empty) | token count << 8 |
    # tag << 16; [1:7] the word's bytes, 4 an int; [7] the slack; [8 + t] token t's id << 8
    # | its end in bytes of the word. One record, not an array per field: a hit reads one
    # line of records, not six.
    records: np.ndarray


def new_word_cache(capacity: int) -> WordCache:
    """An empty table of ``capacity`` slots (a power of two, at least ``WAYS``; 0: a
    table that caches nothing)."""
    if capacity < 0 or capacity & (capacity - 1) or 0 < capacity < WAYS:
        raise ValueError(f"word cache capacity {capacity}: expected 0 or a power of two of at least {WAYS}")
    records = huge_page_zeros((capacity, RECORD_INTS), np.int32)  # probed at random: huge pages pay
    return WordCache(records)


def clear_word_cache(cache: WordCache) -> None:
    """Empty the table (a slot of length 0 holds no word)."""
    cache.records[:, 0] = 0


def cached_word_count(cache: WordCache) -> int:
    """How many slots hold a word."""
    return int(np.count_nonzero(cache.records[:, 0] & 0xFF))


@cached_njit(nogil=True, inline="always")
def table_use(cache, usage, src):
    """How text ``src`` uses the table: NO_TABLE, TABLE or PROBE (see WINDOW_BYTES)."""
    if cache.records.shape[0] == 0:
        return NO_TABLE
    n = src.shape[0]
    ends = min(n, MAX_WORD_BYTES)
    h = word_hash(src, 0, ends) ^ (word_hash(src, n - ends, n) >> np.uint64(7))
    if (h >> np.uint64(40)) & np.uint64(PROBE_EVERY - 1) == 0:
        return PROBE
    return TABLE if usage[_U_SKIP] == 0 else NO_TABLE


@cached_njit(nogil=True, inline="always")
def count_use(usage, held, found):
    """Count a probe's word of ``held`` bytes that the table holds now, ``found`` of them
    there before it (all or none); at the end of a window, skip the table or use it again
    by what the window found."""
    usage[_U_LOOKED] += held
    usage[_U_FOUND] += found
    if usage[_U_LOOKED] >= WINDOW_BYTES:
        usage[_U_SKIP] = 1 if usage[_U_FOUND] * 100 < usage[_U_MIN_HIT] * usage[_U_LOOKED] else 0
        usage[_U_LOOKED] = 0
        usage[_U_FOUND] = 0


# Bytes 0..k of an 8-byte chunk, by how many of its bytes belong to the word (0-8).
_CHUNK_MASKS = np.array([0] + [(1 << (8 * k)) - 1 for k in range(1, 8)] + [(1 << 64) - 1], np.uint64)
_MIX = np.uint64(0xBF58476D1CE4E5B9)


@cached_njit(nogil=True, inline="always")
def word_hash(text, start, end):
    """A hash of word text[start:end] (at most MAX_WORD_BYTES): FNV-1a over its three
    8-byte chunks (bytes past the word masked to 0), then a multiply-xorshift, so every
    byte reaches the bits ``first_slot`` and ``tag_of`` read. Eight bytes a step, no
    branch on the word's length: byte by byte, the hash's serial multiplies and its
    loop's exit (mispredicted, words vary in length) cost hf mode ~14 % of its time on
    text the cache has not seen (BENCHMARKS.md, the stream rows)."""
    n = end - start
    direct = start + MAX_WORD_BYTES <= text.shape[0]  # else the chunks are read byte by byte
    h = _FNV_OFFSET ^ np.uint64(n)
    for k in range(MAX_WORD_BYTES // 8):
        left = min(max(n - 8 * k, 0), 8)
        if direct:
            chunk = load_u64(text, start + 8 * k)
        else:
            chunk = np.uint64(0)
            for b in range(left):
                chunk |= np.uint64(text[start + 8 * k + b]) << np.uint64(8 * b)
        h = (h ^ (chunk & _CHUNK_MASKS[left])) * _FNV_PRIME
    h = (h ^ (h >> np.uint64(31))) * _MIX
    return h ^ (h >> np.uint64(29))


@intrinsic
def _prefetch(typingctx, array, index):
    """Start loading the cache line of array.flat[index] (a hint: no fault, no result)."""
    def codegen(context, builder, signature, args):
        data = context.make_array(signature.args[0])(context, builder, args[0]).data
        address = builder.gep(data, [args[1]])
        i32 = ir.IntType(32)
        hint = cgutils.get_or_insert_function(
            builder.module, ir.FunctionType(ir.VoidType(), [address.type, i32, i32, i32]), "llvm.prefetch.p0")
        builder.call(hint, [address, i32(0), i32(3), i32(1)])  # a read, keep it in every level, data
        return context.get_dummy_value()
    return types.void(array, index), codegen


@cached_njit(nogil=True, inline="always")
def first_slot(cache, h):
    """The first slot of the set of a word with hash ``h``. The set is picked by the
    hash's upper half folded into the lower: FNV-1a's low bits mix only the low bits of
    each byte (a product's low bits depend on its factors' low bits alone)."""
    sets = np.uint64(cache.records.shape[0] // WAYS)
    return np.int64((h ^ (h >> np.uint64(32))) & (sets - np.uint64(1))) * WAYS


@cached_njit(nogil=True, inline="always")
def tag_of(h):
    """15 bits of hash ``h`` that ``first_slot`` does not use (up to 2^19 slots), kept in
    a record's header: a lookup passes over another word of the same length without
    comparing its bytes (a text's words mostly start alike, with "▁")."""
    return np.int32(h >> np.uint64(49))


@cached_njit(nogil=True, inline="always")
def prefetch_slot(cache, text, start, end):
    """Start loading the lines of word text[start:end]'s set, so that its lookup a few
    words later hits, and return the word's hash for that lookup (0 for a word the table
    does not take). A lookup otherwise waits for a miss (the table is 8 MiB, probed at
    random): with the set of the word 8 ahead loaded meanwhile, hf mode is ~7 % faster
    on the multilingual bench."""
    if end - start <= MAX_WORD_BYTES and cache.records.shape[0] > 0:
        h = word_hash(text, start, end)
        first = first_slot(cache, h)
        for slot in range(first, first + WAYS):
            _prefetch(cache.records, slot * np.int64(cache.records.shape[1]))
        return h
    return np.uint64(0)


@cached_njit(nogil=True, inline="always")
def lookup(cache, text, start, end, h):
    """The slot holding word text[start:end] (hash ``h``), or -1."""
    first = first_slot(cache, h)
    n = end - start
    key = n | (tag_of(h) << 16)
    for slot in range(first, first + WAYS):
        if cache.records[slot, 0] & _KEY_MASK != key:  # another word (or none): no byte compared
            continue
        i = 0
        while i < n and (cache.records[slot, 1 + (i >> 2)] >> ((i & 3) * 8)) & 0xFF == text[start + i]:
            i += 1
        if i == n:
            return slot
    return -1


@cached_njit(nogil=True, inline="always")
def claim_slot(cache, h):
    """The slot to write a new word with hash ``h`` into: an empty one of its set, else
    the one two bits of its hash pick (at the default size, bits that neither
    ``first_slot`` nor ``tag_of`` uses).

    Picking by the hash costs nothing to keep (no order to update on every hit, nothing
    moved); two words of a full set evict each other only where they pick the same slot."""
    first = first_slot(cache, h)
    for slot in range(first, first + WAYS):
        if cache.records[slot, 0] == 0:
            return slot
    return first + (np.int64(h >> np.uint64(47)) & (WAYS - 1))


@cached_njit(nogil=True, inline="always")
def forget(cache, slot):
    """Empty ``slot``: its word is looked up no more."""
    cache.records[slot, 0] = 0


@cached_njit(nogil=True, inline="always")
def token_count(cache, slot):
    return (cache.records[slot, 0] >> 8) & 0xFF


@cached_njit(nogil=True, inline="always")
def token_at(cache, slot, t):
    """(id, end in bytes of the word) of the slot's token t."""
    v = cache.records[slot, _HEAD + t]
    return v >> 8, v & 0xFF


@cached_njit(nogil=True, inline="always")
def put_token(cache, slot, t, token_id, end):
    cache.records[slot, _HEAD + t] = (token_id << 8) | end


# The float32 slack takes ``records_f32``, the records viewed as float32 once per call
# (``records.view`` in each read measured slower: a view is built every time).


@cached_njit(nogil=True, inline="always")
def put_word(cache, slot, text, start, end, h, count):
    n = end - start
    for k in range(6):
        packed = 0
        for b in range(4):
            i = 4 * k + b
            if i < n:
                packed |= np.int32(text[start + i]) << (8 * b)  # type: ignore[assignment]  # numba: one int type
        cache.records[slot, 1 + k] = packed
    cache.records[slot, 0] = n | (count << 8) | (tag_of(h) << 16)


@cached_njit(nogil=True, inline="always")
def put_slack(records_f32, slot, slack):
    """Keep ``slack`` (a float32) in the slot of the word just put there."""
    records_f32[slot, _SLACK] = slack


@cached_njit(nogil=True, inline="always")
def slack_of(records_f32, slot):
    return records_f32[slot, _SLACK]
