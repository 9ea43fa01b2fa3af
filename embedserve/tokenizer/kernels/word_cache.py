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

The table is open addressing with one probe: a word's FNV-1a hash picks its slot, the
slot keeps the word's bytes for verification, and a new word overwrites whatever was
there. Token ids must fit 23 bits (the Tokenizer checks). Its size is fixed at
construction (no growth, no eviction bookkeeping); words longer than ``MAX_WORD_BYTES``
are not cached.

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

MAX_WORD_BYTES = 24  # longer words skip the cache
# A record is one 64-byte cache line of ints: length | count << 8, the word (4 bytes an
# int), sentencepiece mode's slack (float32 bits), then the tokens. Twice as many of
# these in the same memory as 128-byte records held more hits than the 9th-24th token
# slots did (BENCHMARKS.md, tokenizer section); a word of more tokens is not cached.
_SLACK = 1 + MAX_WORD_BYTES // 4
_HEAD = _SLACK + 1
RECORD_INTS = 16
# 8 tokens a word, in both modes: sentencepiece mode's hit replays the path's float32
# additions with each token's score read from the model, not kept here (kept, they
# halved the tokens a record holds, and a fifth of the multilingual bench's text is in
# words of 5-8 tokens).
TOKEN_INTS = RECORD_INTS - _HEAD
_FNV_OFFSET = np.uint64(0xCBF29CE484222325)
_FNV_PRIME = np.uint64(0x100000001B3)


class WordCache(NamedTuple):
    # int32 [C, RECORD_INTS]: [0] word length (0: empty) | token count << 8; [1:7] the
    # word's bytes, 4 an int; [7 + t] token t's id << 8 | its end in bytes of the word.
    # One record, not an array per field: a lookup touches two cache lines, not six.
    records: np.ndarray

    @property
    def lengths(self) -> np.ndarray:
        """A view of records[:, 0] (clearing it empties the table).

        Not a field: a strided view is typed by Numba as an 'A'-layout array, but
        records[:, 0] of an empty table is contiguous ('C'), so a table of no slots and a
        real one would compile every kernel that takes a cache twice.
        """
        return self.records[:, 0]


def new_word_cache(capacity: int) -> WordCache:
    """An empty table of ``capacity`` slots (a power of two; 0: a table that caches nothing)."""
    if capacity < 0 or capacity & (capacity - 1):
        raise ValueError(f"word cache capacity {capacity}: expected 0 or a power of two")
    records = huge_page_zeros((capacity, RECORD_INTS), np.int32)  # probed at random: huge pages pay
    return WordCache(records)


@cached_njit(nogil=True, inline="always")
def word_hash(text, start, end):
    h = _FNV_OFFSET
    for i in range(start, end):
        h = (h ^ np.uint64(text[i])) * _FNV_PRIME
    return h


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
def prefetch_slot(cache, text, start, end):
    """Start loading the line of word text[start:end]'s slot, so that its lookup a few
    words later hits, and return the word's hash for that lookup (0 for a word the table
    does not take). A lookup otherwise waits for a miss (the table is 8 MiB, probed at
    random): with the slot of the word 8 ahead loaded meanwhile, hf mode is ~7 % faster
    on the multilingual bench."""
    if end - start <= MAX_WORD_BYTES and cache.records.shape[0] > 0:
        h = word_hash(text, start, end)
        slot = np.int64(h & np.uint64(cache.records.shape[0] - 1))
        _prefetch(cache.records, slot * np.int64(cache.records.shape[1]))
        return h
    return np.uint64(0)


@cached_njit(nogil=True, inline="always")
def lookup(cache, text, start, end, h):
    """The slot holding word text[start:end] (hash ``h``), or -1."""
    slot = np.int64(h & np.uint64(cache.records.shape[0] - 1))
    n = end - start
    if cache.records[slot, 0] & 0xFF != n:
        return -1
    for i in range(n):
        if (cache.records[slot, 1 + (i >> 2)] >> ((i & 3) * 8)) & 0xFF != text[start + i]:
            return -1
    return slot


@cached_njit(nogil=True, inline="always")
def token_count(cache, slot):
    return cache.records[slot, 0] >> 8


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
def put_word(cache, slot, text, start, end, count):
    n = end - start
    for k in range(6):
        packed = 0
        for b in range(4):
            i = 4 * k + b
            if i < n:
                packed |= np.int32(text[start + i]) << (8 * b)
        cache.records[slot, 1 + k] = packed
    cache.records[slot, 0] = n | (count << 8)


@cached_njit(nogil=True, inline="always")
def put_slack(records_f32, slot, slack):
    """Keep ``slack`` (a float32) in the slot of the word just put there."""
    records_f32[slot, _SLACK] = slack


@cached_njit(nogil=True, inline="always")
def slack_of(records_f32, slot):
    return records_f32[slot, _SLACK]
