"""Templates, truncation and packing of raw token runs into one flat batch.

Input: the raw runs from ``encoder.encode_many`` (token ids without specials, per
text a start and a count). Output: ``ids [T]`` and ``cu_seqlens [B+1]`` with the
template's special tokens around each sequence, cut to ``max_length`` (specials
included) from the right or the left when asked.

Pairs are cut longest-first exactly as Hugging Face ``tokenizers`` does (its
``TruncationStrategy::LongestFirst``): with a budget ``m`` for the two texts, if the
shorter one ``s`` exceeds m both get m; else the longer gets ``max(s, m - s)``; if
that still exceeds m, they split it m // 2 and m - m // 2 (the first text getting
the smaller half when it was the shorter one).
"""

from __future__ import annotations

import numba as nb
import numpy as np

from embedserve.errors import InvalidInput
from embedserve.tokenizer.kernel_cache import cached_njit

NO_LIMIT = -1


def truncation_limit(max_length: int | None, truncation: str | None) -> tuple[int, bool]:
    """(max_length or NO_LIMIT, cut from the left) for the encode API's arguments, checked."""
    if truncation is None:
        return NO_LIMIT, False
    if truncation not in ("right", "left"):
        raise InvalidInput(f"truncation must be 'right', 'left' or None, got {truncation!r}", "truncation")
    if max_length is None or max_length < 0:
        raise InvalidInput("truncation needs a max_length >= 0", "max_length")
    return int(max_length), truncation == "left"


@nb.njit(inline="always")
def _keep(count: int, budget: int) -> int:
    if budget == NO_LIMIT or count <= budget:
        return count
    return max(budget, 0)


@nb.njit(inline="always")
def longest_first(n_a: int, n_b: int, budget: int) -> tuple[int, int]:
    """How many tokens of each text a pair keeps within ``budget`` (tokenizers' rule)."""
    if budget == NO_LIMIT or n_a + n_b <= budget:
        return n_a, n_b
    swap = n_a > n_b
    first, second = (n_b, n_a) if swap else (n_a, n_b)
    if first > budget:
        second = first
    else:
        second = max(first, budget - first)
    if first + second > budget:
        first = budget // 2
        second = first + budget % 2
    if swap:
        first, second = second, first
    return min(n_a, first), min(n_b, second)


@cached_njit(nogil=True)
def pack_single(raw_ids, raw_spans, tok_start, tok_count, prefix, suffix, max_length, from_left,
                want_offsets):
    """Pack each raw run as prefix + run + suffix, truncated to max_length."""
    n = tok_start.shape[0]
    n_special = prefix.shape[0] + suffix.shape[0]
    budget = NO_LIMIT if max_length == NO_LIMIT else max_length - n_special
    cu = np.zeros(n + 1, np.int32)
    truncated = np.zeros(n, np.bool_)
    original = np.zeros(n, np.int32)
    for i in range(n):
        keep = _keep(tok_count[i], budget)
        truncated[i] = keep < tok_count[i]
        original[i] = tok_count[i] + n_special
        cu[i + 1] = cu[i] + keep + n_special
    ids = np.empty(cu[n], np.int32)
    offsets = np.zeros((cu[n] if want_offsets else 0, 2), np.int32)
    for i in range(n):
        w = cu[i]
        keep = cu[i + 1] - cu[i] - n_special
        first = tok_start[i] + (tok_count[i] - keep if from_left else 0)
        w = _put(ids, w, prefix)
        ids[w:w + keep] = raw_ids[first:first + keep]
        if want_offsets:
            offsets[w:w + keep] = raw_spans[first:first + keep]
        w = _put(ids, w + keep, suffix)
    return ids, cu, truncated, original, offsets


@cached_njit(nogil=True)
def pack_pairs(raw_ids, raw_spans, a_start, a_count, b_start, b_count, prefix, middle, suffix,
               max_length, from_left, want_offsets, prefix_types, a_type, middle_types, b_type, suffix_types):
    """Pack pair i as prefix + a_i + middle + b_i + suffix, cut longest-first.

    Also returns each token's segment id: ``*_types`` give one per special of the prefix,
    middle and suffix, ``a_type`` / ``b_type`` (arrays of one) the texts'.
    """
    n = a_start.shape[0]
    n_special = prefix.shape[0] + middle.shape[0] + suffix.shape[0]
    budget = NO_LIMIT if max_length == NO_LIMIT else max(max_length - n_special, 0)
    keep_a = np.zeros(n, np.int64)
    keep_b = np.zeros(n, np.int64)
    cu = np.zeros(n + 1, np.int32)
    truncated = np.zeros(n, np.bool_)
    original = np.zeros(n, np.int32)
    for i in range(n):
        keep_a[i], keep_b[i] = longest_first(a_count[i], b_count[i], budget)
        truncated[i] = keep_a[i] < a_count[i] or keep_b[i] < b_count[i]
        original[i] = a_count[i] + b_count[i] + n_special
        cu[i + 1] = cu[i] + keep_a[i] + keep_b[i] + n_special
    ids = np.empty(cu[n], np.int32)
    types = np.empty(cu[n], np.int32)
    offsets = np.zeros((cu[n] if want_offsets else 0, 2), np.int32)
    for i in range(n):
        w = _put(types, cu[i], prefix_types)
        types[w:w + keep_a[i]] = a_type[0]
        w = _put(types, w + keep_a[i], middle_types)
        types[w:w + keep_b[i]] = b_type[0]
        _put(types, w + keep_b[i], suffix_types)
        w = _put(ids, cu[i], prefix)
        w = _copy_run(raw_ids, raw_spans, a_start[i], a_count[i], keep_a[i], from_left, ids, offsets, w,
                      want_offsets)
        w = _put(ids, w, middle)
        w = _copy_run(raw_ids, raw_spans, b_start[i], b_count[i], keep_b[i], from_left, ids, offsets, w,
                      want_offsets)
        _put(ids, w, suffix)
    return ids, cu, truncated, original, offsets, types


@nb.njit(inline="always")
def _put(ids, w, specials):
    for k in range(specials.shape[0]):
        ids[w + k] = specials[k]
    return w + specials.shape[0]


@nb.njit(inline="always")
def _copy_run(raw_ids, raw_spans, start, count, keep, from_left, ids, offsets, w, want_offsets):
    first = start + (count - keep if from_left else 0)
    ids[w:w + keep] = raw_ids[first:first + keep]
    if want_offsets:
        offsets[w:w + keep] = raw_spans[first:first + keep]
    return w + keep
