"""Hugging Face's pre-tokenizers for compat="hf": WhitespaceSplit and Metaspace.

Runs over the normalized text that normalize_hf.py produced, writing the final bytes
(with the Metaspace replacement, ``▁``) and the [start, end) word ranges Viterbi runs
on, as tokenizers 0.23.3 splits them:

- ``WhitespaceSplit``: words are the runs between ``char::is_whitespace`` characters.
- ``Metaspace``: in each word, U+0020 becomes the replacement; the replacement is
  prepended unless the word already starts with it (``always``; ``first`` only when the
  word starts at original offset 0; ``never``); with ``split`` a new word starts at
  every replacement character (tokenizers' MergedWithNext). An empty normalized
  string has no words.

When the normalizer's last step is ``Replace`` of runs of spaces by one space (" {2,}",
XLM-R's), normalize_hf.py leaves it to this pass (``P_COLLAPSE_SPACES``): a run of
spaces is read as one space aligned to the run's last space, as that step would have
written it, and the text is not scanned and copied once more for it.

Origins (character offsets) follow tokenizers' alignments: what Replace inserts takes the
alignment of the last character it removed, and the prepended replacement that of the
word's first character.
"""

from __future__ import annotations

import numba as nb
import numpy as np

from embedserve.tokenizer.kernel_cache import cached_njit
from embedserve.tokenizer.kernels.graphemes import decode_utf8
from embedserve.tokenizer.kernels.origins import origin_end, origin_start, set_origin
from embedserve.tokenizer.kernels.swar import leading_run, load_u64, outside_printable, store_u64
from embedserve.tokenizer.spec import SCRATCH_TOO_SMALL

# Slots of normalize_hf's int64 params that this module reads.
P_WS_SPLIT, P_PREPEND, P_SPLIT, P_REP_LEN, P_REP = 0, 1, 2, 3, 4  # P_REP..+3: replacement bytes
P_COLLAPSE_SPACES = 9  # (slot 8 is normalize_hf's)
PREPEND_ALWAYS, PREPEND_FIRST, PREPEND_NEVER = 0, 1, 2
_SPACE = 0x20
_NO_CHAR = -1  # the code point read at the end of the text


@nb.njit(inline="always")
def is_rust_whitespace(cp: int) -> bool:
    """Rust's ``char::is_whitespace`` (the Unicode White_Space property)."""
    if cp < 0x80:
        return cp == 0x20 or 0x09 <= cp <= 0x0D
    return (cp == 0x85 or cp == 0xA0 or cp == 0x1680 or 0x2000 <= cp <= 0x200A or cp == 0x2028
            or cp == 0x2029 or cp == 0x202F or cp == 0x205F or cp == 0x3000)


@nb.njit(inline="always")
def put(buf, origin, w, byte, o_start, o_end):
    """Write one output byte and the source range it came from (origins.py)."""
    buf[w] = byte
    set_origin(origin, w, o_start, o_end)


@nb.njit(inline="always")
def matches(buf, i, e, params, p_start, p_len):
    """Does buf[i:e] start with the p_len bytes stored at params[p_start:]?"""
    if i + p_len > e:
        return False
    for k in range(p_len):
        if buf[i + k] != params[p_start + k]:
            return False
    return True


@cached_njit(nogil=True)
def pre_tokenize(params, buf, origin, s, e, limit, words):
    """WhitespaceSplit (optional) then Metaspace over buf[s:e] into buf[0:limit] and
    ``words``; returns (bytes, words) or (SCRATCH_TOO_SMALL, 0) when out of room. One flat loop: a
    helper taking arrays, called per character or word, costs reference counting."""
    ws_split = params[P_WS_SPLIT] != 0
    scheme = params[P_PREPEND]
    split = params[P_SPLIT] != 0
    rep_len = params[P_REP_LEN]
    rep_first = params[P_REP]
    collapse_spaces = params[P_COLLAPSE_SPACES] != 0
    block_copy = rep_first >= 0x80  # an ASCII replacement character would end a block
    w, n_words, word_start = 0, 0, 0
    in_piece = False
    i = s
    while i <= e:
        if in_piece:
            # Inside a piece, a run of characters that are neither whitespace nor a
            # space nor start with the replacement's first byte (most of any text) is
            # copied as it is, one character a step. Every whitespace character above
            # ASCII (is_rust_whitespace) starts with C2 (U+0085, U+00A0), E1 (U+1680),
            # E2 (U+2000-U+205F) or E3 (U+3000), so a character that starts with none
            # of them is copied without decoding it.
            # Printable ASCII but the space a word (8 bytes) at a time, up to the first
            # other byte (buf is read at or past ``limit`` and written below it, so the
            # two never meet).
            while block_copy and i + 8 <= e and w + 8 <= limit:
                word = load_u64(buf, i)
                run = leading_run(outside_printable(word, 0x21))
                store_u64(buf, w, word)  # the bytes past the run are written over later
                for k in range(run):
                    set_origin(origin, w + k, origin_start(origin, i + k), origin_end(origin, i + k))
                w += run
                i += run
                if run < 8:
                    break
            while i < e:
                b = buf[i]
                if b < 0x80:
                    if b == _SPACE or 0x09 <= b <= 0x0D or b == rep_first or w >= limit:
                        break
                    put(buf, origin, w, b, origin_start(origin, i), origin_end(origin, i))
                    w += 1
                    i += 1
                    continue
                if b <= 0xC2 or 0xE1 <= b <= 0xE3 or b == rep_first:
                    break  # a stray continuation byte, or maybe whitespace: the general path
                width = 2 + int(b >= 0xE0) + int(b >= 0xF0)  # the character's bytes
                if i + width > e or w + width > limit:
                    break
                for k in range(width):
                    put(buf, origin, w + k, buf[i + k], origin_start(origin, i + k), origin_end(origin, i + k))
                w += width
                i += width
        if i == e:
            cp, n, is_space = _NO_CHAR, 0, True  # the end closes the last piece
        else:
            b = buf[i]
            cp, n = (np.int64(b), 1) if b < 0x80 else decode_utf8(buf, i)  # type: ignore[assignment]  # numba: one int type
            if cp == _SPACE and collapse_spaces:  # the run is one space (module docstring)
                while i + n < e and buf[i + n] == _SPACE:
                    n += 1
            is_space = ws_split and is_rust_whitespace(cp)
        if is_space:
            if in_piece and w > word_start:
                if n_words >= words.shape[0]:
                    return SCRATCH_TOO_SMALL, 0
                words[n_words, 0], words[n_words, 1] = word_start, w
                n_words += 1
            in_piece = False
            if i == e:
                break
            i += n
            continue
        is_rep = cp == _SPACE or (buf[i] == rep_first and n == rep_len
                                  and matches(buf, i, e, params, P_REP, rep_len))
        if not in_piece:  # a piece (word of WhitespaceSplit, or the whole text) starts
            in_piece = True
            word_start = w
            if not is_rep and (scheme == PREPEND_ALWAYS or (scheme == PREPEND_FIRST and origin_start(origin, i) == 0)):
                if w + rep_len > limit:
                    return SCRATCH_TOO_SMALL, 0
                # Aligned as tokenizers' ``prepend`` aligns it: to the piece's first character.
                for k in range(rep_len):
                    put(buf, origin, w + k, params[P_REP + k], origin_start(origin, i), origin_end(origin, i + n - 1))
                w += rep_len
        if is_rep:
            if split and w > word_start:  # MergedWithNext: a word starts at each ▁
                if n_words >= words.shape[0]:
                    return SCRATCH_TOO_SMALL, 0
                words[n_words, 0], words[n_words, 1] = word_start, w
                n_words += 1
                word_start = w
            if w + rep_len > limit:
                return SCRATCH_TOO_SMALL, 0
            # A run of spaces collapsed to one is aligned to its last space, as tokenizers'
            # Replace aligns what it inserts (to the last byte it removed).
            first = i + n - 1 if cp == _SPACE else i
            for k in range(rep_len):
                put(buf, origin, w + k, params[P_REP + k], origin_start(origin, first), origin_end(origin, i + n - 1))
            w += rep_len
        else:
            if w + n > limit:
                return SCRATCH_TOO_SMALL, 0
            for k in range(n):
                put(buf, origin, w + k, buf[i + k], origin_start(origin, i + k), origin_end(origin, i + k))
            w += n
        i += n
    return w, n_words
