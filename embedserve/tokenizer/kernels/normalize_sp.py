"""SentencePiece's normalizer (compat="sentencepiece"), as sentencepiece 0.2.3 does it.

Mirrors ``Normalizer::Normalize`` in sentencepiece's src/normalizer.cc:
the longest charsmap match over bytes at each position (no match: the UTF-8 character
is copied); with remove_extra_whitespaces, leading pieces that normalize to exactly
" " are dropped, spaces at the head of a piece that follows a piece ending in a
space are dropped, and trailing spaces are stripped; add_dummy_prefix puts one space
in front; escape_whitespaces writes every space as U+2581. The whole string is one
Viterbi range. See spec.py for the ``*_into`` contract shared with normalize_hf.
"""

from __future__ import annotations

import numba as nb
import numpy as np

from embedserve.tokenizer.formats.charsmap import NO_RULE, bmp_char_table, longest_match
from embedserve.tokenizer.kernel_cache import cached_njit
from embedserve.tokenizer.spec import SCRATCH_TOO_SMALL, TokenizerSpec

# params layout: [add_dummy_prefix, remove_extra_whitespaces, escape_whitespaces, 0]
# followed by charsmap.bmp_char_table (65536 entries): per BMP code point the longest
# match it starts, valid when the next byte is below the entry's ``next_min``.
_P_DUMMY, _P_REMOVE_WS, _P_ESCAPE = 0, 1, 2
_P_TABLE = 4
_SPACE = 0x20
_NOT_LOOKED_UP = -2  # neither a rule nor NO_RULE yet


def sp_params(spec: TokenizerSpec, charsmap_units: np.ndarray) -> np.ndarray:
    """The int64 parameter vector for ``normalize_sp_into``."""
    params = np.zeros(_P_TABLE + 0x10000, np.int64)
    params[_P_DUMMY] = spec.add_dummy_prefix
    params[_P_REMOVE_WS] = spec.remove_extra_whitespaces
    params[_P_ESCAPE] = spec.escape_whitespaces
    params[_P_TABLE:] = bmp_char_table(charsmap_units)
    return params


@nb.njit(inline="always")
def utf8_len(lead) -> int:
    """Bytes in the UTF-8 character that starts with ``lead`` (used by normalize_hf)."""
    if lead < 0x80:
        return 1
    if lead < 0xE0:
        return 2
    if lead < 0xF0:
        return 3
    return 4


@cached_njit(nogil=True)
def normalize_sp_into(src, units, strings, params, out_bytes, out_origin, out_words):
    # One flat loop with no calls that take arrays on the common path: a Numba call
    # with array arguments costs reference counting, more than the work per character.
    n = src.shape[0]
    cap = out_bytes.shape[0] - 3  # room for one more escaped space or UTF-8 char
    remove_ws = params[_P_REMOVE_WS] != 0
    escape = params[_P_ESCAPE] != 0
    leading = remove_ws  # still dropping leading pieces that normalize to exactly " "
    is_prev_space = remove_ws
    o = 0
    pos = 0
    while pos < n:
        # 1. The piece at pos: `length` source bytes -> strings[value:] (NUL-ended) or,
        #    with value == NO_RULE, the source character itself.
        b = np.int64(src[pos])
        length = 1 if b < 0x80 else (2 if b < 0xE0 else (3 if b < 0xF0 else 4))
        length = min(length, n - pos)
        value = _NOT_LOOKED_UP
        if length <= 3:
            if length == 1:
                cp = b
            elif length == 2:
                cp = ((b & 0x1F) << 6) | (np.int64(src[pos + 1]) & 0x3F)
            else:
                cp = ((b & 0x0F) << 12) | ((np.int64(src[pos + 1]) & 0x3F) << 6) | (np.int64(src[pos + 2]) & 0x3F)
            entry = params[_P_TABLE + cp]
            if pos + length == n or np.int64(src[pos + length]) < (entry >> 32):
                value = np.int64(np.int32(entry & 0xFFFFFFFF))
        if value == _NOT_LOOKED_UP:  # no table answer: walk the trie
            match, found = longest_match(units, src, pos, n)
            value = NO_RULE
            if match > 0:
                length, value = match, found
        # 2. Leading whitespace: drop pieces that are exactly " ".
        if leading:
            if value == NO_RULE:
                is_space = length == 1 and b == _SPACE
            else:
                is_space = strings[value] == _SPACE and value + 1 < strings.shape[0] and strings[value + 1] == 0
            if is_space:
                pos += length
                continue
            leading = False
        if o == 0 and params[_P_DUMMY] != 0:
            o = _put_space(out_bytes, out_origin, 0, escape, pos, pos)
        if o > cap:
            return SCRATCH_TOO_SMALL, 0
        # 3. Write the piece, spaces escaped, its leading spaces dropped after a space.
        if value == NO_RULE:
            if length == 1 and b == _SPACE:
                if not is_prev_space:
                    o = _put_space(out_bytes, out_origin, o, escape, pos, pos + 1)
                    is_prev_space = True
            else:
                for k in range(length):
                    out_bytes[o] = src[pos + k]
                    out_origin[o, 0] = pos
                    out_origin[o, 1] = pos + length
                    o += 1
                is_prev_space = False
        else:
            k = value
            if is_prev_space:
                while k < strings.shape[0] and strings[k] == _SPACE:
                    k += 1
            last = -1
            while k < strings.shape[0] and strings[k] != 0:
                if o > cap:
                    return SCRATCH_TOO_SMALL, 0
                c = strings[k]
                if c == _SPACE:
                    o = _put_space(out_bytes, out_origin, o, escape, pos, pos + length)
                else:
                    out_bytes[o] = c
                    out_origin[o, 0] = pos
                    out_origin[o, 1] = pos + length
                    o += 1
                last = c
                k += 1
            if last >= 0:
                is_prev_space = last == _SPACE
        pos += length
        if not remove_ws:
            is_prev_space = False
    if remove_ws:  # strip trailing spaces
        if escape:
            while o >= 3 and out_bytes[o - 3] == 0xE2 and out_bytes[o - 2] == 0x96 and out_bytes[o - 1] == 0x81:
                o -= 3
        else:
            while o >= 1 and out_bytes[o - 1] == _SPACE:
                o -= 1
    if o == 0:
        return 0, 0
    if out_words.shape[0] < 1:
        return SCRATCH_TOO_SMALL, 0
    out_words[0, 0] = 0
    out_words[0, 1] = o
    return o, 1


@nb.njit(inline="always")
def _put_space(out_bytes, out_origin, o, escape, origin_start, origin_end):
    if escape:
        out_bytes[o] = 0xE2
        out_bytes[o + 1] = 0x96
        out_bytes[o + 2] = 0x81
        for k in range(3):
            out_origin[o + k, 0] = origin_start
            out_origin[o + k, 1] = origin_end
        return o + 3
    out_bytes[o] = _SPACE
    out_origin[o, 0] = origin_start
    out_origin[o, 1] = origin_end
    return o + 1
