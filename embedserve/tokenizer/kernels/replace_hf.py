"""The ``Replace`` normalizer step of compat="hf", as tokenizers 0.23.3 runs it.

A literal pattern, or runs of at least ``min_count`` copies of one character (the
regex ``" {2,}"`` of XLM-R's tokenizer.json), replaced leftmost first. The step's
parameters sit in normalize_hf's int64 params at offset ``at``:
``[STEP_REPLACE_LITERAL, len(p), len(c), p..., c...]`` or
``[STEP_REPLACE_RUN, len(char), min_count, len(c), char..., c...]``. Output follows
the ``*_into`` contract of spec.py (bytes plus their source ranges).
"""

from __future__ import annotations

import numba as nb

from embedserve.tokenizer.kernel_cache import cached_njit
from embedserve.tokenizer.kernels.normalize_sp import utf8_len
from embedserve.tokenizer.kernels.origins import origin_end, origin_start
from embedserve.tokenizer.kernels.pretokenize_hf import matches, put
from embedserve.tokenizer.spec import SCRATCH_TOO_SMALL

STEP_REPLACE_LITERAL, STEP_REPLACE_RUN = 3, 4  # step kinds in normalize_hf's params


@cached_njit(nogil=True)
def replace_applies(params, at, buf, s, e):
    """Would the Replace step at params[at] change buf[s:e]? (A read-only scan.)"""
    if params[at] == STEP_REPLACE_LITERAL:
        p_len, min_count, p_start = params[at + 1], 1, at + 3
    else:
        p_len, min_count, p_start = params[at + 1], params[at + 2], at + 4
    first = params[p_start]
    run = 0
    i = s
    while i < e:
        if buf[i] == first and matches(buf, i, e, params, p_start, p_len):
            run += 1
            if run >= min_count:
                return True
            i += p_len
        else:
            run = 0
            i += 1
    return False


@cached_njit(nogil=True)
def replace_into(params, at, buf, origin, s, e, w, limit):
    """A Replace step at params[at] over buf[s:e] into buf[w:limit]; end of output or SCRATCH_TOO_SMALL."""
    kind = params[at]
    if kind == STEP_REPLACE_LITERAL:
        p_len, c_len, min_count = params[at + 1], params[at + 2], 1
        p_start = at + 3
    else:  # STEP_REPLACE_RUN: runs of >= min_count copies of one character
        p_len, min_count, c_len = params[at + 1], params[at + 2], params[at + 3]
        p_start = at + 4
    c_start = p_start + p_len
    repeat = kind == STEP_REPLACE_RUN
    first = params[p_start]
    i = s
    while i < e:
        if buf[i] != first:  # the common case, checked without a call taking arrays
            n = utf8_len(buf[i])
            if w + n > limit:
                return SCRATCH_TOO_SMALL
            for m in range(n):
                put(buf, origin, w + m, buf[i + m], origin_start(origin, i + m), origin_end(origin, i + m))
            w += n
            i += n
            continue
        k, count = i, 0
        while matches(buf, k, e, params, p_start, p_len) and (repeat or count == 0):
            k += p_len
            count += 1
        if count >= min_count:
            if w + c_len > limit:
                return SCRATCH_TOO_SMALL
            # tokenizers aligns what Replace inserts to the last byte it removed: the
            # match's last character.
            last = k - 1
            while last > i and (buf[last] & 0xC0) == 0x80:
                last -= 1
            for m in range(c_len):
                put(buf, origin, w + m, params[c_start + m], origin_start(origin, last), origin_end(origin, k - 1))
            w += c_len
            i = k
            continue
        k = max(k, i + utf8_len(buf[i]))  # copy the unmatched run (or one character)
        if w + (k - i) > limit:
            return SCRATCH_TOO_SMALL
        for m in range(k - i):
            put(buf, origin, w + m, buf[i + m], origin_start(origin, i + m), origin_end(origin, i + m))
        w += k - i
        i = k
    return w


@nb.njit(inline="always")
def replace_step_size(params, at):
    if params[at] == STEP_REPLACE_LITERAL:
        return 3 + params[at + 1] + params[at + 2]
    return 4 + params[at + 1] + params[at + 3]
