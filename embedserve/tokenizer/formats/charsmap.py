"""The precompiled charsmap: SentencePiece's normalization rules as a Darts-clone trie.

Layout of the blob (``NormalizerSpec.precompiled_charsmap``, also the base64
``precompiled_charsmap`` of a tokenizer.json ``Precompiled`` normalizer)::

    <trie size in bytes: uint32 LE> <Darts-clone double array: uint32 units>
    <normalized strings: NUL-terminated UTF-8, concatenated>

A trie value is the offset of the replacement string in the strings blob.
Lookup helpers are Numba functions over the two arrays:
``longest_match`` (what sentencepiece's normalizer uses) and ``shortest_match``
(the first / shortest common prefix, what Hugging Face's ``Precompiled`` uses).
"""

from __future__ import annotations

import numba as nb
import numpy as np

from embedserve.errors import ModelLoadError
from embedserve.tokenizer.kernel_cache import cached_njit

NO_RULE = -1  # the value of "no key matches"


def parse_charsmap(blob: bytes, source: str = "<charsmap>") -> tuple[np.ndarray, np.ndarray]:
    """Split a precompiled charsmap into (trie units uint32[:], strings uint8[:]).

    An empty blob gives two empty arrays (no normalization rules).
    """
    if not blob:
        return np.zeros(0, np.uint32), np.zeros(0, np.uint8)
    if len(blob) <= 4:
        raise ModelLoadError(f"{source}: field precompiled_charsmap: blob of {len(blob)} bytes is broken")
    trie_size = int.from_bytes(blob[:4], "little")
    if trie_size >= len(blob) or trie_size % 4:
        raise ModelLoadError(f"{source}: field precompiled_charsmap: trie size {trie_size} "
                             f"does not fit a blob of {len(blob)} bytes")
    units = np.frombuffer(blob, np.uint32, trie_size // 4, 4).copy()
    strings = np.frombuffer(blob, np.uint8, len(blob) - 4 - trie_size, 4 + trie_size).copy()
    return units, strings


@nb.njit(inline="always")
def _offset(unit: np.uint32) -> np.int64:
    u = np.int64(unit)
    return (u >> 10) << ((u & (1 << 9)) >> 6)


@nb.njit(inline="always")
def _label(unit: np.uint32) -> np.int64:
    return np.int64(unit) & ((1 << 31) | 0xFF)


@nb.njit(inline="always")
def _has_leaf(unit: np.uint32) -> bool:
    return ((np.int64(unit) >> 8) & 1) == 1


@nb.njit(inline="always")
def _value(unit: np.uint32) -> np.int64:
    return np.int64(unit) & ((1 << 31) - 1)


@nb.njit(inline="always")
def _prefix_match(units, src, start, end, first):
    """Walk src[start:end] down the trie; the longest key, or the first one if ``first``."""
    if units.shape[0] == 0:
        return 0, NO_RULE
    node = _offset(units[0])
    best_len = 0
    best_value = NO_RULE
    for i in range(start, end):
        c = np.int64(src[i])
        node ^= c
        if node >= units.shape[0]:
            break
        unit = units[node]
        if _label(unit) != c:
            break
        node ^= _offset(unit)
        if _has_leaf(unit):
            best_len = i + 1 - start
            best_value = _value(units[node])
            if first:
                break
    return best_len, best_value


@cached_njit(nogil=True)
def longest_match(units: np.ndarray, src: np.ndarray, start: int, end: int) -> tuple[int, int]:
    """Longest key that is a prefix of src[start:end]: (length in bytes, value), or (0, NO_RULE)."""
    return _prefix_match(units, src, start, end, False)


@cached_njit(nogil=True)
def shortest_match(units: np.ndarray, src: np.ndarray, start: int, end: int) -> tuple[int, int]:
    """Shortest (first found) key that is a prefix of src[start:end]: (length, value) or (0, NO_RULE)."""
    return _prefix_match(units, src, start, end, True)


NO_LONGER_KEY = 256  # first-byte bound when no longer key starts with the character
_NEXT_MIN_SHIFT, _NEXT_MAX_SHIFT = 32, 48


@nb.njit(inline="always")
def rule_of(entry: int) -> int:
    """The rule of a ``bmp_char_table`` entry: the replacement of the key that is exactly
    its character, NO_RULE if none."""
    return np.int64(np.int32(entry & 0xFFFFFFFF))  # type: ignore[return-value]  # numba: int64 is its int


@nb.njit(inline="always")
def may_go_on(entry: int, byte: int) -> bool:
    """Whether a key longer than the character of ``bmp_char_table`` entry ``entry`` may
    go on with ``byte`` (the byte after the character); if not, the entry alone is the
    longest match there."""
    return ((entry >> _NEXT_MIN_SHIFT) & 0x1FF) <= byte <= ((entry >> _NEXT_MAX_SHIFT) & 0xFF)


@nb.njit(inline="always")
def has_longer_key(entry: int) -> bool:
    """Whether any key longer than the entry's character starts with it."""
    return ((entry >> _NEXT_MIN_SHIFT) & 0x1FF) != NO_LONGER_KEY


def table_rules(entries: np.ndarray) -> np.ndarray:
    """``rule_of`` each of ``bmp_char_table`` entries, at once (int64)."""
    return (entries & 0xFFFFFFFF).astype(np.uint32).view(np.int32).astype(np.int64)


def lowest_continuations(entries: np.ndarray) -> np.ndarray:
    """Per ``bmp_char_table`` entry, the smallest first byte a longer key goes on with
    (NO_LONGER_KEY where none does): no byte below it can go on (``may_go_on``)."""
    return (entries >> _NEXT_MIN_SHIFT) & 0x1FF


def table_entry(rule: int, next_min: int = NO_LONGER_KEY, next_max: int = 0) -> int:
    """A ``bmp_char_table`` entry (for comparisons: no longer key is the defaults)."""
    return (next_max << _NEXT_MAX_SHIFT) | (next_min << _NEXT_MIN_SHIFT) | (rule & 0xFFFFFFFF)


@cached_njit()
def _encode_cp(cp: int, buf: np.ndarray) -> int:
    if cp < 0x80:
        buf[0] = cp
        return 1
    if cp < 0x800:
        buf[0] = 0xC0 | (cp >> 6)
        buf[1] = 0x80 | (cp & 0x3F)
        return 2
    buf[0] = 0xE0 | (cp >> 12)
    buf[1] = 0x80 | ((cp >> 6) & 0x3F)
    buf[2] = 0x80 | (cp & 0x3F)
    return 3


@cached_njit()
def bmp_char_table(units: np.ndarray) -> np.ndarray:
    """Per BMP code point: what a longest match starting with it is, when that is knowable.

    Entry = rule | next_min << 32 | next_max << 48: ``rule`` is the replacement offset of
    a key that is exactly this character (NO_RULE if none; ``rule_of``); ``next_min`` and
    ``next_max`` the smallest and largest first byte of the continuation of any LONGER
    key starting with this character (NO_LONGER_KEY and 0 if none). If the byte after the
    character is outside them (``may_go_on``), the longest match is decided by this entry
    alone, without walking the trie. Both bounds, not the smallest alone: a Cyrillic
    letter that a combining mark composes with (е + U+0308) has longer keys from byte
    0xCC, and the next letter's lead byte (0xD0, 0xD1) is above it, so with the lower
    bound alone nearly every Cyrillic character walked the trie.
    """
    table = np.empty(0x10000, np.int64)
    buf = np.zeros(4, np.uint8)
    for cp in range(0x10000):
        rule = NO_RULE
        next_min = NO_LONGER_KEY
        next_max = 0
        if 0xD800 <= cp < 0xE000 or units.shape[0] == 0:
            table[cp] = (np.int64(next_min) << _NEXT_MIN_SHIFT) | (rule & 0xFFFFFFFF)
            continue
        n = _encode_cp(cp, buf)
        node = _offset(units[0])
        ok = True
        for i in range(n):
            c = np.int64(buf[i])
            node ^= c
            if node >= units.shape[0] or _label(units[node]) != c:
                ok = False
                break
            unit = units[node]
            node ^= _offset(unit)
            if i == n - 1 and _has_leaf(unit):
                rule = _value(units[node])
        if ok:
            for c in range(1, 256):  # type: ignore[assignment]  # numba: one int type; byte 0 is the leaf marker
                child = node ^ c
                if child < units.shape[0] and _label(units[child]) == c:
                    next_min = c  # type: ignore[assignment]  # numba: one int64 type
                    break
            for c in range(255, next_min - 1, -1):  # type: ignore[assignment]  # numba: one int type
                child = node ^ c
                if child < units.shape[0] and _label(units[child]) == c:
                    next_max = c  # type: ignore[assignment]  # numba: one int64 type
                    break
        table[cp] = ((np.int64(next_max) << _NEXT_MAX_SHIFT) | (np.int64(next_min) << _NEXT_MIN_SHIFT)
                     | (np.int64(rule) & 0xFFFFFFFF))
    return table
