"""SentencePiece's normalizer (compat="sentencepiece"), as sentencepiece 0.2.3 does it.

Mirrors ``Normalizer::Normalize`` in sentencepiece's src/normalizer.cc:
at each position first the longest USER_DEFINED piece (``PrefixMatcher``; copied
verbatim, never normalized), else the longest charsmap match over bytes (no match: the
UTF-8 character is copied); with remove_extra_whitespaces, leading pieces that normalize to exactly
" " are dropped, spaces at the head of a piece that follows a piece ending in a
space are dropped, and trailing spaces are stripped; add_dummy_prefix puts one space
in front; escape_whitespaces writes every space as U+2581. The whole string is one
Viterbi range. See spec.py for the ``*_into`` contract shared with normalize_hf.
"""

from __future__ import annotations

import numba as nb
import numpy as np

from embedserve.tokenizer.formats.charsmap import (
    NO_RULE,
    bmp_char_table,
    longest_match,
    lowest_continuations,
    may_go_on,
    rule_of,
    table_rules,
)
from embedserve.tokenizer.kernel_cache import cached_njit
from embedserve.tokenizer.kernels.branchless import unpredictable_select
from embedserve.tokenizer.kernels.origins import set_origin
from embedserve.tokenizer.kernels.swar import high_bits, leading_run, load_u64, outside_printable, store_u64
from embedserve.tokenizer.spec import SCRATCH_TOO_SMALL, PieceKind, TokenizerSpec

# params layout: [add_dummy_prefix, remove_extra_whitespaces, escape_whitespaces,
# user-defined section start (0: none), whether every printable ASCII character but the
# space is copied as it is whatever ASCII follows (no key is it, or starts with it and
# goes on in ASCII)] followed by charsmap.bmp_char_table (65536
# entries): per BMP code point the longest match it starts, valid when no longer key
# may go on with the next byte (``charsmap.may_go_on``). The user-defined section (at U): U[b]..U[b + 1] are
# the entries of the pieces whose first byte is b (257 bounds), then the entries, two
# int64 each (offset of the piece in the strings array, its byte length), longest first
# within a first byte. The pieces' bytes are appended to the charsmap strings,
# NUL-terminated, so a match is written exactly like a charsmap replacement.
_P_DUMMY, _P_REMOVE_WS, _P_ESCAPE, _P_USER, _P_PRINTABLE_PLAIN = 0, 1, 2, 3, 4
_P_TABLE = 5
_USER_BOUNDS = 257
_SPACE = 0x20
_NOT_LOOKED_UP = -2  # neither a rule nor NO_RULE yet


def sp_params(spec: TokenizerSpec, charsmap_units: np.ndarray,
              charsmap_strings: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The int64 parameter vector for ``normalize_sp_into`` and the strings array it
    reads (the charsmap's, plus the USER_DEFINED pieces)."""
    user = sorted({spec.pieces[i].encode("utf-8") for i in np.flatnonzero(spec.kinds == PieceKind.USER_DEFINED)
                   if spec.pieces[i]}, key=lambda piece: (piece[0], -len(piece), piece))
    table_end = _P_TABLE + 0x10000
    params = np.zeros(table_end + (_USER_BOUNDS + 2 * len(user) if user else 0), np.int64)
    params[_P_DUMMY] = spec.add_dummy_prefix
    params[_P_REMOVE_WS] = spec.remove_extra_whitespaces
    params[_P_ESCAPE] = spec.escape_whitespaces
    table = bmp_char_table(charsmap_units)
    params[_P_TABLE:table_end] = table
    printable = table[0x21:0x7F]
    params[_P_PRINTABLE_PLAIN] = bool((table_rules(printable) == NO_RULE).all()
                                      and (lowest_continuations(printable) >= 0x80).all())
    if not user:
        return params, charsmap_strings
    params[_P_USER] = table_end
    first_bytes = np.array([piece[0] for piece in user], np.int64)
    params[table_end:table_end + _USER_BOUNDS] = np.searchsorted(first_bytes, np.arange(_USER_BOUNDS))
    entries = params[table_end + _USER_BOUNDS:].reshape(-1, 2)
    blob = bytearray()
    for k, piece in enumerate(user):
        entries[k] = charsmap_strings.shape[0] + len(blob), len(piece)
        blob += piece + b"\0"
    return params, np.concatenate([charsmap_strings, np.frombuffer(bytes(blob), np.uint8)])


@nb.njit(inline="always")
def _user_match(src, pos, n, params, strings):
    """(length, strings offset) of the longest USER_DEFINED piece at src[pos:], or (0, NO_RULE)."""
    user = params[_P_USER]
    b = np.int64(src[pos])
    for k in range(params[user + b], params[user + b + 1]):  # longest first
        entry = user + _USER_BOUNDS + 2 * k
        start, length = params[entry], params[entry + 1]
        if length > n - pos:
            continue
        j = 1
        while j < length and src[pos + j] == strings[start + j]:
            j += 1
        if j == length:
            return length, start
    return 0, NO_RULE


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
    has_user = params[_P_USER] != 0
    leading = remove_ws  # still dropping leading pieces that normalize to exactly " "
    is_prev_space = remove_ws
    dummy = params[_P_DUMMY] != 0
    o = 0
    pos = 0
    while pos < n:
        if not has_user and not leading and (o > 0 or not dummy):
            o, pos, is_prev_space = _copy_plain_run(src, pos, n, params, out_bytes, out_origin, o, cap, escape,
                                                    remove_ws, is_prev_space)
            if pos >= n:
                break
        # 1. The piece at pos: `length` source bytes -> strings[value:] (NUL-ended) or,
        #    with value == NO_RULE, the source character itself.
        b = np.int64(src[pos])
        length = 1 if b < 0x80 else (2 if b < 0xE0 else (3 if b < 0xF0 else 4))
        length = min(length, n - pos)
        value = _NOT_LOOKED_UP
        if has_user:  # a USER_DEFINED piece wins over the charsmap and is copied as it is
            user_length, user_value = _user_match(src, pos, n, params, strings)
            if user_length > 0:
                length, value = user_length, user_value
        if value == _NOT_LOOKED_UP and length <= 3:
            if length == 1:
                cp = b
            elif length == 2:
                cp = ((b & 0x1F) << 6) | (np.int64(src[pos + 1]) & 0x3F)
            else:
                cp = ((b & 0x0F) << 12) | ((np.int64(src[pos + 1]) & 0x3F) << 6) | (np.int64(src[pos + 2]) & 0x3F)
            entry = params[_P_TABLE + cp]
            if pos + length == n or not may_go_on(entry, np.int64(src[pos + length])):
                value = rule_of(entry)
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
                    set_origin(out_origin, o, pos, pos + length)
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
                    set_origin(out_origin, o, pos, pos + length)
                    o += 1
                last = c
                k += 1
            if last >= 0:
                is_prev_space = last == _SPACE
        pos += length
        if not remove_ws:
            is_prev_space = False
    # Where normalization stopped consuming the source, one past the output (what a last
    # token's offsets end at, encode._spans_to_chars): after stripped trailing spaces, the
    # first of them (its origin stays in that row), else the end.
    end = o
    if remove_ws:  # strip trailing spaces
        if escape:
            while o >= 3 and out_bytes[o - 3] == 0xE2 and out_bytes[o - 2] == 0x96 and out_bytes[o - 1] == 0x81:
                o -= 3
        else:
            while o >= 1 and out_bytes[o - 1] == _SPACE:
                o -= 1
    if o == end:
        if o >= out_bytes.shape[0]:
            return SCRATCH_TOO_SMALL, 0
        set_origin(out_origin, o, n, n)
    if o == 0:
        return 0, 0
    if out_words.shape[0] < 1:
        return SCRATCH_TOO_SMALL, 0
    out_words[0, 0] = 0
    out_words[0, 1] = o
    return o, 1


@nb.njit(inline="always")
def _copy_plain_run(src, pos, n, params, out_bytes, out_origin, o, cap, escape, remove_ws, is_prev_space):
    """Copy src[pos:] up to the first character the general loop must see (a 4-byte
    or cut-off one, one the charsmap has a rule for, or one whose match the table cannot
    decide alone), writing exactly what that loop writes for the others (spaces escaped
    and collapsed). Returns (o, pos, is_prev_space) after the run.

    Most text is such runs; here each character costs a table lookup and a copy, not
    the general loop's checks for user pieces, leading spaces and the dummy prefix
    (the normalizer alone: 12.2 -> 8.2 us a text on the multilingual bench). Callers
    skip it while leading spaces are dropped, before the dummy prefix and with user
    pieces (each position must try those first).
    """
    # Printable ASCII but the space, a word (8 bytes) at a time where the charsmap
    # leaves all of it as it is (``_P_PRINTABLE_PLAIN``), up to the first other byte or
    # the last before a byte of 0x80 or more (a longer key may start there).
    blocks = escape and params[_P_PRINTABLE_PLAIN] != 0
    block_cap = out_bytes.shape[0] - 8
    while pos < n and o <= cap:
        if escape:
            # ASCII, spaces escaped: branch-free on whether a character is a space (on
            # unseen text a mispredicted branch or two a word). A space writes "▁" and
            # advances 3 unless it follows a space (collapsed), another character
            # writes itself and advances 1; the two bytes after it are overwritten by
            # what follows (``cap`` leaves room for them).
            while pos < n and o <= cap:
                if blocks and pos + 9 <= n and o <= block_cap:
                    word = load_u64(src, pos)
                    run = leading_run(outside_printable(word, 0x21) | high_bits(load_u64(src, pos + 1)))
                    store_u64(out_bytes, o, word)  # the bytes past the run are written over later
                    for k in range(run):
                        set_origin(out_origin, o + k, pos + k, pos + k + 1)
                    o += run
                    pos += run
                    if run > 0:
                        is_prev_space = False
                    if pos >= n or o > cap:
                        break
                b = np.int64(src[pos])
                if b >= 0x80:
                    break
                entry = params[_P_TABLE + b]
                if np.int32(entry & 0xFFFFFFFF) != NO_RULE:
                    break
                if pos + 1 < n and may_go_on(entry, np.int64(src[pos + 1])):
                    break  # a longer key may match: the trie decides
                is_space = b == _SPACE
                out_bytes[o] = unpredictable_select(is_space, np.int64(0xE2), b)
                out_bytes[o + 1] = 0x96
                out_bytes[o + 2] = 0x81
                for k in range(3):
                    set_origin(out_origin, o + k, pos, pos + 1)
                o += unpredictable_select(is_space, unpredictable_select(is_prev_space, np.int64(0), np.int64(3)),
                                          np.int64(1))
                is_prev_space = is_space & remove_ws
                pos += 1
            if pos >= n or o > cap:
                break
        b = np.int64(src[pos])
        if b < 0x80:
            length = 1
            cp = b
        elif b < 0xE0:
            length = 2
            if pos + 2 > n:
                break
            cp = ((b & 0x1F) << 6) | (np.int64(src[pos + 1]) & 0x3F)
        elif b < 0xF0:
            length = 3
            if pos + 3 > n:
                break
            cp = ((b & 0x0F) << 12) | ((np.int64(src[pos + 1]) & 0x3F) << 6) | (np.int64(src[pos + 2]) & 0x3F)
        else:
            break
        entry = params[_P_TABLE + cp]
        if np.int32(entry & 0xFFFFFFFF) != NO_RULE:
            break
        if pos + length < n and may_go_on(entry, np.int64(src[pos + length])):
            break  # a longer key may match: the trie decides
        if b == _SPACE:
            if not is_prev_space:
                o = _put_space(out_bytes, out_origin, o, escape, pos, pos + 1)
                is_prev_space = True
        else:
            for k in range(length):
                out_bytes[o + k] = src[pos + k]
                set_origin(out_origin, o + k, pos, pos + length)
            o += length
            is_prev_space = False
        pos += length
        if not remove_ws:
            is_prev_space = False
    return o, pos, is_prev_space


@nb.njit(inline="always")
def _put_space(out_bytes, out_origin, o, escape, origin_start, origin_end):
    if escape:
        out_bytes[o] = 0xE2
        out_bytes[o + 1] = 0x96
        out_bytes[o + 2] = 0x81
        for k in range(3):
            set_origin(out_origin, o + k, origin_start, origin_end)
        return o + 3
    out_bytes[o] = _SPACE
    set_origin(out_origin, o, origin_start, origin_end)
    return o + 1


@nb.njit(inline="always")
def split_at_metaspace(text, n, words):
    """Cut text[:n] into words, each starting at a "▁" (its first one at 0): the words
    sentencepiece mode's word cache looks up. Returns how many, or SCRATCH_TOO_SMALL."""
    # A search that skips (Horspool's): the byte where a "▁" (E2 96 81) starting at i
    # would end says how far the next one can start: 0x81 -> look at i, 0x96 -> i + 1,
    # 0xE2 -> i + 2, any other byte -> i + 3. Most positions are passed over unread.
    count = 0
    start = 0
    i = 1
    while i + 2 < n:
        last = text[i + 2]
        if last == 0x81 and text[i + 1] == 0x96 and text[i] == 0xE2:
            if count + 1 >= words.shape[0]:
                return SCRATCH_TOO_SMALL
            words[count, 0] = start
            words[count, 1] = i
            count += 1
            start = i
            i += 3
        elif last == 0x96:
            i += 1
        elif last == 0xE2:
            i += 2
        else:
            i += 3
    if n > 0:
        if count >= words.shape[0]:
            return SCRATCH_TOO_SMALL
        words[count, 0] = start
        words[count, 1] = n
        count += 1
    return count
