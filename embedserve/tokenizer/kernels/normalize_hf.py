"""Hugging Face's normalizer + pre-tokenizer (compat="hf"), as tokenizers 0.23.3 runs them.

``normalize_hf_into`` follows the ``*_into`` contract in spec.py. It runs the
tokenizer.json normalizer steps in order:

- ``Precompiled`` (tokenizers' normalizers/precompiled.rs over spm_precompiled): walk
  extended grapheme clusters (graphemes.py); a cluster shorter than 6 bytes is looked
  up whole and, if any charsmap key is a prefix of it, the whole cluster becomes the
  replacement of the FIRST (shortest) such key, even when that key covers only part of
  the cluster (``ｶ`` + U+0301 -> ``カ``: the mark is dropped). Otherwise each character
  is looked up alone. The prefix search stops at a NUL byte, as spm_precompiled's does.
- ``Replace`` (replace_hf.py): a literal, or runs of one character (``" {2,}"``),
  leftmost first.
- ``Strip``: Rust's ``char::is_whitespace`` at either end.

then hands the text to pretokenize_hf.py (WhitespaceSplit, Metaspace), which writes
the final bytes and the Viterbi word ranges.

Work layout: ``out_bytes``/``out_origin`` are used as two halves; each normalizer step
reads one half and writes the other (a first Precompiled step reads ``src`` itself),
the pre-tokenizer writes the final result at 0.
The caller grows the scratch when SCRATCH_TOO_SMALL comes back. Origins are [start, end) byte ranges
of ``src``. This module does not run Viterbi.
"""

from __future__ import annotations

import numba as nb
import numpy as np

from embedserve.tokenizer.formats.charsmap import (
    NO_RULE,
    bmp_char_table,
    has_longer_key,
    rule_of,
    shortest_match,
    table_entry,
    table_rules,
)
from embedserve.tokenizer.kernel_cache import cached_njit
from embedserve.tokenizer.kernels.graphemes import decode_utf8, next_boundary, pair_joins, property_of
from embedserve.tokenizer.kernels.normalize_sp import utf8_len
from embedserve.tokenizer.kernels.origins import origin_end, origin_rows, origin_start, set_origin
from embedserve.tokenizer.kernels.pretokenize_hf import (
    P_COLLAPSE_SPACES,
    P_PREPEND,
    P_REP,
    P_REP_LEN,
    P_SPLIT,
    P_WS_SPLIT,
    PREPEND_ALWAYS,
    PREPEND_FIRST,
    PREPEND_NEVER,
    is_rust_whitespace,
    pre_tokenize,
    put,
)
from embedserve.tokenizer.kernels.replace_hf import (
    STEP_REPLACE_LITERAL,
    STEP_REPLACE_RUN,
    replace_applies,
    replace_into,
    replace_step_size,
)
from embedserve.tokenizer.kernels.swar import high_bits, leading_run, load_u64, outside_printable, store_u64
from embedserve.tokenizer.spec import SCRATCH_TOO_SMALL, TokenizerSpec

# params layout (int64): a fixed header, charsmap.bmp_char_table (65,536 entries: per
# BMP code point, the rule of the key that is exactly that character, and whether any
# longer key starts with it), then the normalizer steps.
# The header's first slots (P_*) are pretokenize_hf's; P_REP..P_REP+3 hold the bytes.
_P_N_STEPS = 8
_P_PRINTABLE_PLAIN = 10  # 1: no printable ASCII character (0x20-0x7E) is a key by itself
_P_TABLE = 16
_P_STEPS = _P_TABLE + 0x10000
_CR = 0x0D
_STEP_PRECOMPILED, _STEP_STRIP = 1, 2  # the Replace kinds: replace_hf.STEP_REPLACE_*
_NUL = 0
_WHOLE_CLUSTER_LIMIT = 6  # clusters shorter than this (in bytes) are looked up whole
# The bmp_char_table entry of a character that no key starts with.
_PLAIN_CHAR = table_entry(NO_RULE)
# Replace(" {2,}", " ") as the last step (XLM-R's) is left to pretokenize_hf.py.
_COLLAPSE_SPACES = ("replace_run", " ", 2, " ")


def hf_params(spec: TokenizerSpec, charsmap_units: np.ndarray) -> np.ndarray:
    """The int64 parameter vector for ``normalize_hf_into``, built once per tokenizer."""
    pipeline = spec.hf
    if pipeline is None:
        raise ValueError(f"{spec.source}: no Hugging Face pipeline in this spec")
    params = [0] * _P_STEPS
    params[P_WS_SPLIT] = int(pipeline.whitespace_split)
    params[P_PREPEND] = {"always": PREPEND_ALWAYS, "first": PREPEND_FIRST,
                          "never": PREPEND_NEVER}[pipeline.prepend_scheme]
    params[P_SPLIT] = int(pipeline.split)
    replacement = pipeline.metaspace_replacement.encode("utf-8")
    params[P_REP_LEN] = len(replacement)
    params[P_REP:P_REP + len(replacement)] = list(replacement)
    steps = list(pipeline.normalizer_steps)
    if steps and steps[-1] == _COLLAPSE_SPACES:  # done by the pre-tokenizer, in its pass
        params[P_COLLAPSE_SPACES] = 1
        steps.pop()
    params[_P_N_STEPS] = len(steps)
    table = bmp_char_table(charsmap_units)
    params[_P_TABLE:_P_STEPS] = table.tolist()
    params[_P_PRINTABLE_PLAIN] = int((table_rules(table[0x20:0x7F]) == NO_RULE).all())
    for step in steps:
        params.extend(_encode_step(step))
    return np.asarray(params, np.int64)


def _encode_step(step: tuple) -> list[int]:
    """[kind, ...]: strip: left, right; replace_literal: len(p), len(c), p..., c...;
    replace_run: len(char), min_count, len(c), char..., c..."""
    kind = step[0]
    if kind == "precompiled":
        return [_STEP_PRECOMPILED]
    if kind == "strip":
        return [_STEP_STRIP, int(step[1]), int(step[2])]
    if kind == "replace_literal":
        pattern, content = step[1].encode("utf-8"), step[2].encode("utf-8")
        return [STEP_REPLACE_LITERAL, len(pattern), len(content), *pattern, *content]
    if kind == "replace_run":
        char, content = step[1].encode("utf-8"), step[3].encode("utf-8")
        return [STEP_REPLACE_RUN, len(char), int(step[2]), len(content), *char, *content]
    raise ValueError(f"unknown normalizer step {step!r}")


@nb.njit(inline="always")
def _emit_replacement(strings, value, buf, origin, w, limit, o_start, o_end):
    """Write the NUL-terminated charsmap string at ``value``; new w, or SCRATCH_TOO_SMALL when full."""
    k = value
    while k < strings.shape[0] and strings[k] != _NUL:
        if w >= limit:
            return SCRATCH_TOO_SMALL
        put(buf, origin, w, strings[k], o_start, o_end)
        w += 1
        k += 1
    return w


@nb.njit(inline="always")
def _emit_cluster(strings, value, src, src_origin, raw, i, j, buf, origin, w, limit):
    """The charsmap string at ``value`` in place of the cluster src[i:j], aligned as
    tokenizers' Precompiled aligns a replacement: its t-th character to the cluster's t-th,
    those past the cluster's last character to that one; new w, or SCRATCH_TOO_SMALL."""
    k = value
    at = i  # the cluster's character the next one written is aligned to
    while k < strings.shape[0] and strings[k] != _NUL:
        n_old = utf8_len(src[at])
        o_start, o_end = _origin_start(src_origin, at, raw), _origin_end(src_origin, at + n_old - 1, raw)
        stop = k + utf8_len(strings[k])
        while k < stop and k < strings.shape[0] and strings[k] != _NUL:
            if w >= limit:
                return SCRATCH_TOO_SMALL
            put(buf, origin, w, strings[k], o_start, o_end)
            w += 1
            k += 1
        if at + n_old < j:
            at += n_old
    return w


@nb.njit(inline="always")
def _emit_char(strings, rule, src, src_origin, raw, i, n, buf, origin, w, limit):
    """The character src[i:i + n] as ``rule``'s replacement (each byte from the whole
    character) or, with NO_RULE, as itself; new w, or SCRATCH_TOO_SMALL when full."""
    if rule != NO_RULE:
        return _emit_replacement(strings, rule, buf, origin, w, limit, _origin_start(src_origin, i, raw),
                                 _origin_end(src_origin, i + n - 1, raw))
    if w + n > limit:
        return SCRATCH_TOO_SMALL
    for k in range(n):
        put(buf, origin, w + k, src[i + k], _origin_start(src_origin, i + k, raw), _origin_end(src_origin, i + k, raw))
    return w + n


@nb.njit(inline="always")
def _first_match(units, params, buf, start, end, cp, n):
    """spm_precompiled's ``transform`` of buf[start:end], which begins with the
    character ``cp`` of ``n`` bytes: the rule of the FIRST (shortest) key that is a
    prefix, NO_RULE when none. The search stops at a NUL byte (a NUL is a one-character
    cluster: a Control). BMP characters are answered from the table; longer keys and
    other planes walk the trie."""
    if cp == _NUL:
        return NO_RULE
    if cp < 0x10000:
        entry = params[_P_TABLE + cp]
        rule = np.int64(np.int32(entry & 0xFFFFFFFF))
        if rule != NO_RULE or end == start + n or not has_longer_key(entry):
            return rule
    return shortest_match(units, buf, start, end)[1]


@nb.njit(inline="always")
def _all_ruleless(params, src, i, j):
    """Whether each character of src[i:j] is in the BMP and is no key by itself."""
    while i < j:
        cp, n = decode_utf8(src, i)
        if cp >= 0x10000 or rule_of(params[_P_TABLE + cp]) != NO_RULE:
            return False
        i += n
    return True


@nb.njit(inline="always")
def _origin_start(origin, i, raw):
    """Where byte i of a step's input came from: itself when reading the raw source."""
    return i if raw else origin_start(origin, i)


@nb.njit(inline="always")
def _origin_end(origin, i, raw):
    return i + 1 if raw else origin_end(origin, i)


@cached_njit(nogil=True)
def _precompiled(units, strings, params, src, src_origin, raw, s, e, buf, origin, w, limit):
    """Precompiled over src[s:e] into buf[w:limit]: the end of the output, or SCRATCH_TOO_SMALL.

    ``raw``: origins are written as positions in src (byte i came from byte i;
    ``src_origin`` is not read): the first step's source offsets, with no offsets written
    beforehand, and a later step's positions in its input, which normalize_hf_into turns
    into source offsets after aligning deletions.
    """
    # The common case, a one-character BMP cluster, is handled here and in inlined
    # helpers only: in Numba a real call taking arrays costs reference counting, per
    # character.
    printable_plain = params[_P_PRINTABLE_PLAIN] != 0
    i = s
    while i < e:
        # A run of ASCII characters that no rule starts with and that cannot join the
        # next character in a cluster (most of Latin-script text) is copied as it is:
        # printable ones a word (8 bytes) at a time, up to the first that is not or that
        # a byte of 0x80 or more follows (a combining mark would join it), then byte by
        # byte.
        while printable_plain and i + 9 <= e and w + 8 <= limit:
            word = load_u64(src, i)
            run = leading_run(outside_printable(word, 0x20) | high_bits(load_u64(src, i + 1)))
            store_u64(buf, w, word)  # the bytes past the run are written over later
            for k in range(run):
                set_origin(origin, w + k, _origin_start(src_origin, i + k, raw), _origin_end(src_origin, i + k, raw))
            w += run
            i += run
            if run < 8:
                break
        while i < e and w < limit:
            b = src[i]
            if b >= 0x80 or b == _CR or b == _NUL or (i + 1 < e and src[i + 1] >= 0x80):
                break
            if np.int32(params[_P_TABLE + b] & 0xFFFFFFFF) != NO_RULE:
                break
            put(buf, origin, w, b, _origin_start(src_origin, i, raw), _origin_end(src_origin, i, raw))
            w += 1
            i += 1
        # Likewise a run of 2- and 3-byte characters that no rule starts with, each a
        # cluster of its own (most of non-Latin text); checked and copied here in a
        # tight loop.
        while i < e and w + 3 <= limit:
            b = src[i]
            if b < 0xC0 or b >= 0xF0:
                break
            cp, n = decode_utf8(src, i)
            if np.int32(params[_P_TABLE + cp] & 0xFFFFFFFF) != NO_RULE:
                break
            j = i + n
            if j < e:
                cp2 = np.int64(src[j])
                if cp2 >= 0x80:
                    cp2 = decode_utf8(src, j)[0]
                if pair_joins(property_of(cp), property_of(cp2)):
                    # A cluster (a consonant and its vowel signs: most of Brahmic and
                    # Southeast Asian text). One that starts with a character no key
                    # starts with matches no key whole, so each character is looked up
                    # alone: copied as it is when none of them has a rule either.
                    if params[_P_TABLE + cp] != _PLAIN_CHAR:
                        break
                    j = next_boundary(src, i, e)
                    if w + (j - i) > limit or not _all_ruleless(params, src, i + n, j):
                        break
                    n = j - i
            for k in range(n):
                put(buf, origin, w + k, src[i + k], _origin_start(src_origin, i + k, raw),
                    _origin_end(src_origin, i + k, raw))
            w += n
            i = j
        if i == e:
            break
        b = src[i]
        if b < 0x80:
            cp, n = np.int64(b), 1
        else:
            cp, n = decode_utf8(src, i)
        j = i + n
        if j < e and not (b < 0x80 and src[j] < 0x80 and b != _CR):
            cp2, n2 = decode_utf8(src, j)
            if pair_joins(property_of(cp), property_of(cp2)):
                j = next_boundary(src, i, e)
        if j == i + n and cp < 0x10000:
            # The charsmap search stops at NUL (a Control: always a cluster of its own).
            rule = np.int64(np.int32(params[_P_TABLE + cp] & 0xFFFFFFFF)) if cp != _NUL else NO_RULE
            # Written out rather than through _emit_char: with that helper inlined here this
            # loop took 146 us on 1,760 Cyrillic characters, written out 39 us (why Numba
            # compiles the helper's version so much worse was not pinned down).
            if rule == NO_RULE:
                if w + n > limit:
                    return SCRATCH_TOO_SMALL
                for k in range(n):
                    put(buf, origin, w + k, src[i + k], _origin_start(src_origin, i + k, raw),
                        _origin_end(src_origin, i + k, raw))
                w += n
            else:
                w = _emit_replacement(strings, rule, buf, origin, w, limit, _origin_start(src_origin, i, raw),
                                      _origin_end(src_origin, j - 1, raw))
                if w == SCRATCH_TOO_SMALL:
                    return SCRATCH_TOO_SMALL
            i = j
            continue
        if cp < 0x10000 and params[_P_TABLE + cp] == _PLAIN_CHAR:
            # A cluster (most of Brahmic and Southeast Asian text: a consonant and its
            # vowel signs) that starts with a character no key starts with: the whole
            # cluster matches no key, so each character is looked up alone, as in
            # _precompiled_cluster; written out here, as that call cost ~60 ns a cluster
            # (reference counts on its arrays) and decoded each character twice more.
            # Apart from the one-character path above, not merged with it: one loop for
            # both made this function 20 % slower on the stream texts (3.0 -> 3.7 ms).
            while i < j:
                cp, n = decode_utf8(src, i)
                rule = _first_match(units, params, src, i, i + n, cp, n)
                if rule == NO_RULE:
                    if w + n > limit:
                        return SCRATCH_TOO_SMALL
                    for k in range(n):
                        put(buf, origin, w + k, src[i + k], _origin_start(src_origin, i + k, raw),
                            _origin_end(src_origin, i + k, raw))
                    w += n
                else:
                    w = _emit_replacement(strings, rule, buf, origin, w, limit, _origin_start(src_origin, i, raw),
                                          _origin_end(src_origin, i + n - 1, raw))
                    if w == SCRATCH_TOO_SMALL:
                        return SCRATCH_TOO_SMALL
                i += n
            continue
        w = _precompiled_cluster(units, strings, params, src, src_origin, raw, i, j, buf, origin, w, limit)
        if w == SCRATCH_TOO_SMALL:
            return SCRATCH_TOO_SMALL
        i = j
    return w


@cached_njit(nogil=True)
def _precompiled_cluster(units, strings, params, src, src_origin, raw, i, j, buf, origin, w, limit):
    """A cluster of several characters, or one outside the BMP: src[i:j] -> buf[w:]."""
    cp, n = decode_utf8(src, i)
    if j - i < _WHOLE_CLUSTER_LIMIT:
        rule = _first_match(units, params, src, i, j, cp, n)
        if rule != NO_RULE:
            return _emit_cluster(strings, rule, src, src_origin, raw, i, j, buf, origin, w, limit)
    while i < j:  # each character alone
        cp, n = decode_utf8(src, i)
        rule = _first_match(units, params, src, i, i + n, cp, n)
        w = _emit_char(strings, rule, src, src_origin, raw, i, n, buf, origin, w, limit)
        if w == SCRATCH_TOO_SMALL:
            return SCRATCH_TOO_SMALL
        i += n
    return w


@cached_njit(nogil=True)
def _align_around_deletions(buf, src_lo, src_hi, origin, lo, hi, realign):
    """Precompiled's output buf[lo:hi], read from buf[src_lo:src_hi] and its origins
    positions in that input, aligned where the charsmap deleted characters (controls) as
    tokenizers aligns it. Its ``replace`` records a deletion on the character written
    before: a character an expansion inserted (``ﬁ`` -> ``fi``: the ``i``) is then aligned
    to the first deleted character after it, and deletions before anything was written
    shift every alignment back by as many characters as were deleted (so ``"\\x01abc"``'s
    ``ab`` is at [0, 2), not [1, 3)). The first only where ``realign`` (offsets are
    reported: a scan of the output, ~3 µs a 512-token text); the shift always, as
    prepend_scheme "first" reads where a word starts."""
    p = lo if realign else hi
    prev_start, prev_end = -1, -1
    while p < hi:
        q = p + utf8_len(buf[p])
        start, end = origin_start(origin, p), origin_end(origin, q - 1)
        next_start = origin_start(origin, q) if q < hi else src_hi
        if start == prev_start and end == prev_end and next_start > end:
            for x in range(p, q):  # inserted, and characters were deleted after it
                set_origin(origin, x, end, end + utf8_len(buf[end]))
        prev_start, prev_end = start, end
        p = q
    if hi == lo or origin_start(origin, lo) == src_lo:
        return
    char_of = np.empty(src_hi - src_lo + 1, np.int32)  # input byte -> its character's index
    starts = np.empty(src_hi - src_lo + 1, np.int32)  # character index -> its first byte (then the end)
    chars = 0
    for b in range(src_lo, src_hi):
        if (buf[b] & 0xC0) != 0x80:
            starts[chars] = b
            chars += 1
        char_of[b - src_lo] = chars - 1
    starts[chars] = src_hi
    shift = char_of[origin_start(origin, lo) - src_lo]  # the characters deleted before the first written
    p = lo
    while p < hi:
        q = p + utf8_len(buf[p])
        first = char_of[origin_start(origin, p) - src_lo] - shift
        last = char_of[origin_end(origin, q - 1) - 1 - src_lo] - shift
        for x in range(p, q):
            set_origin(origin, x, starts[first], starts[last + 1])
        p = q


@cached_njit(nogil=True)
def _through_input_origins(origin, lo, hi):
    """Origins of buf[lo:hi] given as positions in a step's input turned into that
    input's own origins (where in the source each came from)."""
    for x in range(lo, hi):
        start, end = origin_start(origin, x), origin_end(origin, x)
        set_origin(origin, x, origin_start(origin, start), origin_end(origin, max(end, start + 1) - 1))


@cached_njit(nogil=True)
def _strip(buf, s, e, left, right):
    """(s, e) with Rust-whitespace characters removed from the chosen ends."""
    while left and s < e:
        cp, n = decode_utf8(buf, s)
        if not is_rust_whitespace(cp):
            break
        s += n
    while right and e > s:
        k = e - 1
        while (buf[k] & 0xC0) == 0x80:
            k -= 1
        cp, n = decode_utf8(buf, k)
        if not is_rust_whitespace(cp):
            break
        e = k
    return s, e


@cached_njit(nogil=True)
def normalize_hf_into(src, units, strings, params, out_bytes, out_origin, out_words, want_offsets):
    """Normalize + pre-tokenize ``src``; see the module docstring and spec.py
    (``want_offsets``: the offsets will be reported)."""
    half = min(out_bytes.shape[0], origin_rows(out_origin, out_bytes.shape[0])) // 2
    n = src.shape[0]
    if n > half:
        return SCRATCH_TOO_SMALL, 0
    at = _P_STEPS
    first = 0
    if params[_P_N_STEPS] > 0 and params[at] == _STEP_PRECOMPILED:
        # The usual first step reads the input, copied to the lower half, into the upper
        # half. The copy costs ~0.1 µs a KB; reading ``src`` itself (read-only) would
        # compile _precompiled a second time, for the read-only type.
        out_bytes[:n] = src
        w = _precompiled(units, strings, params, out_bytes, out_origin, True, 0, n, out_bytes, out_origin,
                         half, 2 * half)
        if w == SCRATCH_TOO_SMALL:
            return SCRATCH_TOO_SMALL, 0
        if origin_rows(out_origin, 0) > 0:  # origins kept (a constant 0 without them)
            _align_around_deletions(out_bytes, 0, n, out_origin, half, w, want_offsets)
        base, s, e = half, half, w
        at += 1
        first = 1
    else:  # start in the upper half with byte-exact origins
        base = half
        for i in range(n):
            put(out_bytes, out_origin, base + i, src[i], i, i + 1)
        s, e = base, base + n
    for _ in range(first, params[_P_N_STEPS]):
        kind = params[at]
        target = 0 if base == half else half
        if kind == _STEP_STRIP:
            s, e = _strip(out_bytes, s, e, params[at + 1] != 0, params[at + 2] != 0)
            at += 3
            continue
        if kind == _STEP_PRECOMPILED:
            # Origins as positions in this step's input first (``raw``), so that deletions
            # are aligned over the input's characters as tokenizers does; then through the
            # input's origins to the source.
            w = _precompiled(units, strings, params, out_bytes, out_origin, True, s, e, out_bytes, out_origin,
                             target, target + half)
            if w != SCRATCH_TOO_SMALL and origin_rows(out_origin, 0) > 0:
                _align_around_deletions(out_bytes, s, e, out_origin, target, w, want_offsets)
                _through_input_origins(out_origin, target, w)
            at += 1
        else:
            if not replace_applies(params, at, out_bytes, s, e):
                at += replace_step_size(params, at)
                continue  # nothing to replace (the usual case): no copy
            w = replace_into(params, at, out_bytes, out_origin, s, e, target, target + half)
            at += replace_step_size(params, at)
        if w == SCRATCH_TOO_SMALL:
            return SCRATCH_TOO_SMALL, 0
        base, s, e = target, target, w
    if base == 0:  # the pre-tokenizer writes at 0: move the text to the upper half first
        for i in range(e - s):
            out_bytes[half + i] = out_bytes[s + i]
            set_origin(out_origin, half + i, origin_start(out_origin, s + i), origin_end(out_origin, s + i))
        s, e = half, half + (e - s)
    return pre_tokenize(params, out_bytes, out_origin, s, e, half, out_words)
