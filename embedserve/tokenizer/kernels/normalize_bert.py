"""BERT's normalizer and pre-tokenizer, as tokenizers 0.23.3 runs them, into code points.

``normalize_bert_into(src, tables, out_cps, out_align, out_words, run)`` reads UTF-8
``src`` and writes the normalized text as code points (``out_cps``), each with the
[start, end) CHARACTER range of ``src`` it came from (``out_align``), and the word
ranges of ``out_cps`` that WordPiece runs on (``out_words``). Stages, in tokenizers'
order, streamed one source character at a time:

1. ``clean_text``: drop U+0000, U+FFFD and "other" characters (Cc/Cf/Cn/Co by the
   unicode_categories crate; tab, LF and CR excepted), whitespace becomes a space.
2. ``handle_chinese_chars``: a space on each side of a CJK ideograph.
3. ``strip_accents``: NFD (with canonical reordering of combining marks), then drop
   nonspacing marks.
4. ``lowercase``: Rust's ``char::to_lowercase`` (one character may become several).
5. ``BertPreTokenizer``: split at whitespace (dropped), isolate each punctuation
   character (ASCII punctuation or Unicode P*).

Alignments follow tokenizers' ``NormalizedString::transform``: a character keeps the
alignment of the character it replaces; one inserted (the 2nd.. of a lowercase or NFD
expansion) takes the alignment of the last source character consumed; removed
characters vanish. After NFD's reordering that is positional: the k-th character that
replaces something takes the k-th consumed alignment, whichever mark moved there.

Per-code-point facts come from ``_bert_char_data.py`` (generated from tokenizers
itself; see scripts/gen_bert_char_data.py), laid out by ``bert_tables`` into a
two-level table of uint16 properties and sorted mapping tables. This module does not
run WordPiece.
"""

from __future__ import annotations

from typing import NamedTuple

import numba as nb
import numpy as np

from embedserve.tokenizer.kernel_cache import cached_njit
from embedserve.tokenizer.kernels.graphemes import decode_utf8
from embedserve.tokenizer.spec import BertNormalization

# Property bits (uint16). The low 8 are switched on only when their stage is on.
DROP, SPACE, MARK, WS, PUNCT, CHINESE, DECOMPOSES, LOWERS = 1, 2, 4, 8, 16, 32, 64, 128
CCC_SHIFT = 8  # bits 8..15: canonical combining class (strip_accents only)
# _bert_char_data.RANGE_VALUES bits
_DATA_DROP, _DATA_SPACE, _DATA_MARK, _DATA_WS, _DATA_PUNCT = 1, 2, 4, 8, 16
_BLOCK = 256
_CJK_RANGES = ((0x4E00, 0x9FFF), (0x3400, 0x4DBF), (0x20000, 0x2A6DF), (0x2A700, 0x2B73F),
               (0x2B740, 0x2B81F), (0x2B920, 0x2CEAF), (0xF900, 0xFAFF), (0x2F800, 0x2FA1F))
_HANGUL_FIRST, _HANGUL_LAST = 0xAC00, 0xD7A3
_SPACE_CP = 0x20


class BertTables(NamedTuple):
    block_of: np.ndarray  # int32 [0x1100]: the row of block_props for cp >> 8
    block_props: np.ndarray  # uint16 [blocks, 256]
    decomp_keys: np.ndarray  # int32 [K] sorted code points with an NFD decomposition
    decomp_start: np.ndarray  # int32 [K + 1] into decomp_cps
    decomp_cps: np.ndarray  # int32
    lower_keys: np.ndarray  # int32 [L] sorted code points lowercase changes
    lower_start: np.ndarray  # int32 [L + 1]
    lower_cps: np.ndarray  # int32
    ascii_lower: np.ndarray  # int32 [128]: ASCII after lowercase (itself when off)
    strip_accents: bool


def bert_tables(normalization: BertNormalization | None) -> BertTables:
    """The tables for one set of BertNormalizer switches (None: no normalizer)."""
    from embedserve.tokenizer.kernels import _bert_char_data as data

    n = normalization or BertNormalization(False, False, False, False)
    starts = np.asarray(data.RANGE_STARTS, np.int64)
    values = np.asarray(data.RANGE_VALUES, np.uint16)
    raw = np.repeat(values, np.diff(np.append(starts, 0x110000)))
    props = np.zeros(0x110000, np.uint16)
    props |= raw & (_DATA_WS | _DATA_PUNCT)  # the pre-tokenizer always runs
    if n.clean_text:
        props |= raw & (_DATA_DROP | _DATA_SPACE)
    if n.handle_chinese_chars:
        for lo, hi in _CJK_RANGES:
            props[lo:hi + 1] |= CHINESE
    if n.strip_accents:
        props |= raw & _DATA_MARK
        keys = np.fromiter(data.DECOMPOSITIONS, np.int64)
        props[keys] |= DECOMPOSES
        props[_HANGUL_FIRST:_HANGUL_LAST + 1] |= DECOMPOSES
        ccc = np.fromiter(data.COMBINING, np.int64)
        props[ccc] |= np.asarray([data.COMBINING[c] << CCC_SHIFT for c in ccc], np.uint16)
    if n.lowercase:
        props[np.fromiter(data.LOWERCASE, np.int64)] |= LOWERS
    blocks, block_of = np.unique(props.reshape(-1, _BLOCK), axis=0, return_inverse=True)
    decomp = _mapping(data.DECOMPOSITIONS if n.strip_accents else {})
    lower = _mapping(data.LOWERCASE if n.lowercase else {})
    ascii_lower = np.arange(128, dtype=np.int32)
    if n.lowercase:
        ascii_lower[ord("A"):ord("Z") + 1] += 32
    return BertTables(block_of.astype(np.int32).reshape(-1), np.ascontiguousarray(blocks), *decomp, *lower,
                      ascii_lower, bool(n.strip_accents))


def _mapping(table: dict[int, tuple[int, ...]]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    keys = sorted(table)
    lengths = [len(table[k]) for k in keys]
    start = np.zeros(len(keys) + 1, np.int32)
    np.cumsum(lengths, out=start[1:])
    cps = np.asarray([c for k in keys for c in table[k]], np.int32)
    return np.asarray(keys, np.int32), start, cps


def max_cps_per_char(normalization: BertNormalization | None) -> int:
    """The most code points one source character can become (sizes the output)."""
    from embedserve.tokenizer.kernels import _bert_char_data as data

    n = normalization or BertNormalization(False, False, False, False)
    most = 3  # a Hangul syllable's jamo
    for cp in set(data.DECOMPOSITIONS) | set(data.LOWERCASE):
        parts = data.DECOMPOSITIONS.get(cp, (cp,)) if n.strip_accents else (cp,)
        most = max(most, sum(len(data.LOWERCASE.get(q, (q,))) if n.lowercase else 1 for q in parts))
    return most


@nb.njit(inline="always")
def props_of(tables, cp):
    return np.int64(tables.block_props[tables.block_of[cp >> 8], cp & 0xFF])


@nb.njit(inline="always")
def _find(keys, cp):
    """Index of cp in the sorted keys, or -1."""
    i = np.searchsorted(keys, cp)
    if i < keys.shape[0] and keys[i] == cp:
        return i
    return -1


@nb.njit(inline="always")
def _emit(tables, cp, a_start, a_end, out_cps, out_align, out_words, state):
    """One NFD-stage output character through the mark filter, lowercase and the
    pre-tokenizer. ``state``: [written, word start, words]."""
    p = props_of(tables, cp)
    if p & MARK:
        return
    if p & LOWERS:
        if cp < 128:
            _place(tables.ascii_lower[cp], a_start, a_end, out_cps, out_align, out_words, state, tables)
        else:
            k = _find(tables.lower_keys, cp)
            for j in range(tables.lower_start[k], tables.lower_start[k + 1]):
                _place(tables.lower_cps[j], a_start, a_end, out_cps, out_align, out_words, state, tables)
        return
    _place_classified(cp, p, a_start, a_end, out_cps, out_align, out_words, state)


@nb.njit(inline="always")
def _place(cp, a_start, a_end, out_cps, out_align, out_words, state, tables):
    _place_classified(cp, props_of(tables, cp), a_start, a_end, out_cps, out_align, out_words, state)


@nb.njit(inline="always")
def _close_word(out_words, state):
    if state[0] > state[1]:
        out_words[state[2], 0] = state[1]
        out_words[state[2], 1] = state[0]
        state[2] += 1
    state[1] = state[0]


@nb.njit(inline="always")
def _place_classified(cp, p, a_start, a_end, out_cps, out_align, out_words, state):
    """The pre-tokenizer: whitespace ends a word, punctuation is a word of its own."""
    if p & WS:
        _close_word(out_words, state)
        return
    if p & PUNCT:
        _close_word(out_words, state)
    w = state[0]
    out_cps[w] = cp
    out_align[w, 0] = a_start
    out_align[w, 1] = a_end
    state[0] = w + 1
    if p & PUNCT:
        _close_word(out_words, state)


@cached_njit(nogil=True)
def _flush_run(tables, run_cps, run_change, run_ccc, run_align, runs, last, out_cps, out_align, out_words,
               state):
    """Sort the pending combining marks by class (stable, as NFD's canonical ordering),
    give them the consumed alignments by position, and emit them; the run is then empty."""
    n_run = runs[0]
    for i in range(1, n_run):  # insertion sort: runs are a few marks long
        cp, ch, cc = run_cps[i], run_change[i], run_ccc[i]
        j = i - 1
        while j >= 0 and run_ccc[j] > cc:
            run_cps[j + 1], run_change[j + 1], run_ccc[j + 1] = run_cps[j], run_change[j], run_ccc[j]
            j -= 1
        run_cps[j + 1], run_change[j + 1], run_ccc[j + 1] = cp, ch, cc
    q = 0
    for i in range(n_run):
        if run_change[i] == 0:
            last[0] = run_align[q, 0]
            last[1] = run_align[q, 1]
            q += 1
        _emit(tables, run_cps[i], last[0], last[1], out_cps, out_align, out_words, state)
    runs[0] = 0
    runs[1] = 0


@cached_njit(nogil=True)
def _feed(tables, cp, a_start, a_end, run_cps, run_change, run_ccc, run_align, runs, last, out_cps, out_align,
          out_words, state):
    """One character of the text after clean_text / chinese into NFD. ``runs``: [marks
    held, of which replaced a source character]."""
    p = props_of(tables, cp)
    if not tables.strip_accents or (p & (DECOMPOSES | (0xFF << CCC_SHIFT))) == 0:
        if runs[0] > 0:
            _flush_run(tables, run_cps, run_change, run_ccc, run_align, runs, last, out_cps, out_align, out_words,
                       state)
        last[0] = a_start
        last[1] = a_end
        _emit(tables, cp, a_start, a_end, out_cps, out_align, out_words, state)
        return
    # Decompose: Hangul arithmetically, the rest from the table; each part then as a
    # starter (class 0, emitted at once) or a mark (held for reordering).
    k = 0
    if _HANGUL_FIRST <= cp <= _HANGUL_LAST:
        index = cp - _HANGUL_FIRST
        trail = 0x11A7 + index % 28
        n_parts = 2 if trail == 0x11A7 else 3
    elif p & DECOMPOSES:
        k = _find(tables.decomp_keys, cp)
        n_parts = tables.decomp_start[k + 1] - tables.decomp_start[k]
    else:
        n_parts = 1
    for part in range(n_parts):
        if _HANGUL_FIRST <= cp <= _HANGUL_LAST:
            index = cp - _HANGUL_FIRST
            d = (0x1100 + index // 588) if part == 0 else (0x1161 + index % 588 // 28) if part == 1 \
                else 0x11A7 + index % 28
        elif p & DECOMPOSES:
            d = tables.decomp_cps[tables.decomp_start[k] + part]
        else:
            d = cp
        ccc = props_of(tables, d) >> CCC_SHIFT
        if ccc == 0:
            if runs[0] > 0:
                _flush_run(tables, run_cps, run_change, run_ccc, run_align, runs, last, out_cps, out_align,
                           out_words, state)
            if part == 0:
                last[0] = a_start
                last[1] = a_end
            _emit(tables, d, last[0], last[1], out_cps, out_align, out_words, state)
        else:
            n_run = runs[0]
            if part == 0:
                run_align[runs[1], 0] = a_start
                run_align[runs[1], 1] = a_end
                runs[1] += 1
            run_cps[n_run] = d
            run_change[n_run] = 0 if part == 0 else 1
            run_ccc[n_run] = ccc
            runs[0] = n_run + 1


@cached_njit(nogil=True)
def normalize_bert_into(src, tables, out_cps, out_align, out_words, run_cps, run_change, run_ccc, run_align):
    """Normalize + pre-tokenize ``src``; returns (code points written, words).

    Output capacity: ``out_cps``/``out_align`` need max_cps_per_char * characters,
    ``out_words`` one row per output code point, the ``run_*`` scratch (marks held for
    reordering) max_cps_per_char * characters as well.
    """
    state = np.zeros(3, np.int64)  # written, word start, words
    last = np.zeros(2, np.int64)  # the alignment of the last source character consumed
    runs = np.zeros(2, np.int64)  # marks held for reordering, of which replaced a source character
    n = src.shape[0]
    i = 0
    ci = 0  # character index of src[i]
    while i < n:
        b = src[i]
        if b < 0x80 and runs[0] == 0:
            # ASCII (most text): no decomposition, no marks, lowercase by table.
            i += 1
            ci += 1
            p = props_of(tables, b)
            if p & DROP:
                continue
            last[0] = ci - 1
            last[1] = ci
            if p & (SPACE | WS):
                _close_word(out_words, state)
                continue
            _place_classified(tables.ascii_lower[b], p, ci - 1, ci, out_cps, out_align, out_words, state)
            continue
        if b < 0x80:
            cp, width = np.int64(b), 1
        else:
            cp, width = decode_utf8(src, i)
        i += width
        a_start, a_end = ci, ci + 1
        ci += 1
        p = props_of(tables, cp)
        if p & DROP:
            continue
        if p & SPACE:
            cp = _SPACE_CP  # type: ignore[assignment]  # numba: one int type
        if p & CHINESE:
            _feed(tables, _SPACE_CP, a_start, a_end, run_cps, run_change, run_ccc, run_align, runs, last, out_cps,
                  out_align, out_words, state)
            _feed(tables, cp, a_start, a_end, run_cps, run_change, run_ccc, run_align, runs, last, out_cps,
                  out_align, out_words, state)
            _feed(tables, _SPACE_CP, a_start, a_end, run_cps, run_change, run_ccc, run_align, runs, last, out_cps,
                  out_align, out_words, state)
            continue
        _feed(tables, cp, a_start, a_end, run_cps, run_change, run_ccc, run_align, runs, last, out_cps, out_align,
              out_words, state)
    if runs[0] > 0:
        _flush_run(tables, run_cps, run_change, run_ccc, run_align, runs, last, out_cps, out_align, out_words,
                   state)
    _close_word(out_words, state)
    return state[0], state[2]
