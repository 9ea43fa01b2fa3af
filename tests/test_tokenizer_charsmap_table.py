"""charsmap.bmp_char_table against the keys it stands for.

The normalizers take a character's longest match from the table, without walking the
trie, when the byte after it cannot go on to a longer key (``may_go_on``: outside the
first bytes of those keys' continuations). Against a charsmap built here from known
rules (the bounds must be exact: a bound too narrow loses a key, too wide sends text
to the trie walk), and against the trie walk (longest_match) on the project's XLM-R
charsmap for every BMP character that starts a longer key, followed by every byte.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from embedserve.tokenizer import Tokenizer
from embedserve.tokenizer.formats.charsmap import (
    NO_RULE,
    bmp_char_table,
    has_longer_key,
    longest_match,
    lowest_continuations,
    may_go_on,
    parse_charsmap,
    rule_of,
    table_rules,
)
from embedserve.tokenizer.formats.charsmap_writer import build_charsmap


@njit
def _disagreements(units, table, code_points):
    """(code point, next byte) pairs where the table decides and the trie walk differs,
    and how many pairs the table decided."""
    found = []
    decided = 0
    buf = np.zeros(8, np.uint8)
    for cp in code_points:
        n = 1 if cp < 0x80 else (2 if cp < 0x800 else 3)
        if n == 1:
            buf[0] = cp
        elif n == 2:
            buf[0], buf[1] = 0xC0 | (cp >> 6), 0x80 | (cp & 0x3F)
        else:
            buf[0], buf[1], buf[2] = 0xE0 | (cp >> 12), 0x80 | ((cp >> 6) & 0x3F), 0x80 | (cp & 0x3F)
        entry = table[cp]
        for byte in range(256):
            if may_go_on(entry, byte):
                continue
            decided += 1
            buf[n] = byte
            for k in range(n + 1, 8):
                buf[k] = 0x80  # continuation bytes: whatever the byte starts, it goes on
            length, value = longest_match(units, buf, 0, 8)
            expected = (n, rule_of(entry)) if rule_of(entry) != NO_RULE else (0, NO_RULE)
            if (length, value) != expected:
                found.append((cp, byte))
    return found, decided


def test_where_the_table_decides_the_trie_walk_agrees(xlmr_tokenizer_dir):
    spec = Tokenizer.from_file(xlmr_tokenizer_dir / "sentencepiece.bpe.model", compat="sentencepiece",
                               cache_dir=None).spec
    units, _ = parse_charsmap(spec.precompiled_charsmap, spec.source)
    table = bmp_char_table(units)
    surrogates = set(range(0xD800, 0xE000))
    longer = [cp for cp in range(0x10000) if cp not in surrogates and has_longer_key(table[cp])]
    # Enough characters that start longer keys to matter: Latin and Cyrillic letters
    # with combining marks, among others.
    assert len(longer) > 300 and 0x0435 in longer and ord("A") in longer
    others = [cp for cp in range(1, 0x10000, 7) if cp not in surrogates and cp not in set(longer)]
    found, decided = _disagreements(units, table, np.array(longer + others, np.int64))
    assert found == []
    assert decided > 0.9 * 256 * len(others)
    # The upper bound matters: a Cyrillic letter's next letter (lead byte 0xD0/0xD1) is
    # decided by the table though 0xCC, a combining mark's, goes on.
    assert not may_go_on(table[0x0435], 0xD0) and may_go_on(table[0x0435], 0xCC)


# Keys that go on after their first character with one first byte (ж + U+0306: 0xCC),
# with two (е + U+0300 / U+0340: 0xCC, 0xCD), with a 3-byte mark (x + U+20D7: 0xE2),
# with ASCII (a + "b"), and characters that are keys themselves and start longer ones.
RULES = {"ж\u0306": "ӂ", "е\u0300": "ѐ", "е\u0308": "ё", "е\u0340": "ѐ", "x\u20d7": "x", "ab": "AB",
         "a": "A", "ﬁ": "fi", "ﬁx": "FIX", "Å": "Å", "\u3000": " "}


def test_the_bounds_are_the_first_bytes_of_the_longer_keys_continuations():
    units, _ = parse_charsmap(build_charsmap(RULES))
    table = bmp_char_table(units)
    strings = dict.fromkeys(RULES)  # the first characters of the keys, and what goes on after them
    firsts: dict[int, set[int]] = {}
    for key in RULES:
        if len(key) > 1:
            firsts.setdefault(ord(key[0]), set()).add(key[1:].encode("utf-8")[0])
    for cp in range(1, 0x10000):  # NUL is the trie's leaf label: the normalizers never look it up here
        if 0xD800 <= cp < 0xE000:
            continue
        entry = table[cp]
        char = chr(cp)
        assert (rule_of(entry) != NO_RULE) == (char in strings), hex(cp)
        goes_on = firsts.get(cp, set())
        assert has_longer_key(entry) == bool(goes_on), hex(cp)
        if goes_on:
            assert [byte for byte in range(256) if may_go_on(entry, byte)] == \
                list(range(min(goes_on), max(goes_on) + 1)), hex(cp)


def test_the_bulk_readings_are_the_entrys_own():
    units, _ = parse_charsmap(build_charsmap(RULES))
    table = bmp_char_table(units)
    assert table_rules(table).tolist() == [rule_of(entry) for entry in table.tolist()]
    lowest = lowest_continuations(table).tolist()
    for entry, low in zip(table.tolist(), lowest, strict=True):
        assert not any(may_go_on(entry, byte) for byte in range(low if low < 256 else 256))
        assert low == 256 or may_go_on(entry, low)
