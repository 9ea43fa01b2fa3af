"""Parity corpora for the tokenizer tests, built from ../shared/data.

The issue's required inputs: every non-empty line of the 388 udhr2 texts and each
whole text; every line of emoji-test.txt; botchan.txt and wagahaiwa_nekodearu.txt cut
into 512-, 4k- and 16k-token chunks (cut on the reference's own token boundaries and
decoded back to text); and seeded hypothesis-generated strings.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import cache

from hypothesis import strategies as st

from conftest import shared_file

CHUNK_TOKENS = (512, 4096, 16384)


def assert_ids_equal(texts: Sequence[str], got, expected: Sequence[Sequence[int]]) -> None:
    """``got`` (a packed batch) equals the reference's ids for every text; names a few that differ."""
    mismatches = [i for i, ids in enumerate(expected) if got.sequence(i).tolist() != list(ids)]
    detail = [(texts[i][:80], got.sequence(i)[:20].tolist(), list(expected[i][:20])) for i in mismatches[:3]]
    assert not mismatches, f"{len(mismatches)} of {len(texts)} differ, e.g. {detail}"


@cache
def udhr_texts() -> tuple[str, ...]:
    directory = shared_file("text/udhr2")
    return tuple(p.read_text(encoding="utf-8") for p in sorted(directory.iterdir()) if p.is_file())


def udhr_lines() -> list[str]:
    return [line for text in udhr_texts() for line in text.split("\n") if line.strip()]


def emoji_lines() -> list[str]:
    return shared_file("text/emoji-test.txt").read_text(encoding="utf-8").split("\n")


def novel_chunks(encode: Callable[[str], Sequence[int]],
                 decode: Callable[[Sequence[int]], str]) -> list[str]:
    """Both novels cut into 512/4k/16k-token pieces of the reference's tokenization."""
    chunks = []
    for name in ("text/botchan.txt", "text/wagahaiwa_nekodearu.txt"):
        ids = list(encode(shared_file(name).read_text(encoding="utf-8")))
        for size in CHUNK_TOKENS:
            chunks += [decode(ids[i:i + size]) for i in range(0, len(ids), size)]
    return chunks


# ---- hypothesis strings -------------------------------------------------------------
WHITESPACE = "".join(chr(c) for c in range(0x110000) if chr(c).isspace()) + \
    "\u200b\u200c\u200d\u2060\ufeff\u180e\u00ad"
COMBINING = "".join(chr(c) for c in range(0x300, 0x370)) + "\u0e31\u0e34\u0e48\u09cb\u09be\u0bcd\u3099\u309a"
EMOJI_ZWJ = ["\U0001F468\u200D\U0001F469\u200D\U0001F467", "\U0001F3F3\uFE0F\u200D\U0001F308",
             "\U0001F44D\U0001F3FD", "\u2764\ufe0f", "\U0001F1EF\U0001F1F5", "\U0001F9D1\u200D\U0001F4BB"]
SCRIPTS = ["Hello world", "Grüße, Straße", "Привет мир", "مرحبا بالعالم", "नमस्ते दुनिया", "שלום עולם",
           "Γειά σου", "你好，世界", "こんにちは世界", "ｶﾞｷﾞｸﾞ", "안녕하세요", "สวัสดีครับ", "வணக்கம்",
           "ሰላም", "გამარჯობა", "Բարեւ", "བཀྲ་ཤིས", "မင်္ဂလာပါ", "សួស្តី", "ᎣᏏᏲ", "ﬁ ﬂ ﷺ ㍻ ①",
           "Ａｂｃ１２３", "e\u0301 a\u0308", "<s> </s> <mask> <pad> <unk>"]
CONTROL = "".join(chr(c) for c in list(range(0, 32)) + list(range(0x7f, 0xa0)))


# What ends a run of printable ASCII that the normalizers copy 8 bytes at a time
# (kernels/swar.py): spaces, controls, DEL, characters with a charsmap rule, combining
# marks that join the byte before, multi-byte characters; and printable ones that do not.
# Also where a charsmap key longer than one character may or may not go on
# (charsmap.bmp_char_table's bounds).
BLOCK_BREAKERS = [" ", "  ", "\t", "\r\n", "\x00", "\x1f", "\x7f", "e\u0301", "A\u0300", "\u00a0", "Ａ", "é",
                  "ﬁ", "😀", "~", "!",
                  # Letters that a combining mark composes with (longer charsmap keys), followed
                  # by the mark and by another letter (whose lead byte is above the mark's).
                  "е\u0308", "и\u0306й", "ёжик", "ии\u0306"]


def block_edge_texts(breakers: Sequence[str]) -> list[str]:
    """Each breaker at every offset of an 8-byte block (and of the next), after a run
    long enough for whole blocks, and at the end of the text."""
    return [("abxa" * 6)[:k] + brk + "ab" * 9 + brk for brk in breakers for k in range(18)]


def _runs(alphabet: str) -> st.SearchStrategy[str]:
    return st.tuples(st.sampled_from(alphabet), st.integers(2, 300)).map(lambda t: t[0] * t[1])


_piece = st.one_of(
    st.text(st.characters(exclude_categories=("Cs",)), max_size=12),
    st.text(st.sampled_from(WHITESPACE), min_size=1, max_size=4),
    st.text(st.sampled_from(COMBINING), min_size=1, max_size=3),
    st.sampled_from(EMOJI_ZWJ),
    st.sampled_from(SCRIPTS),
    st.text(st.sampled_from(CONTROL), min_size=1, max_size=3),
    st.just("\u2581"), st.just("\u2581\u2581 "),
    _runs("a ▁\u3042\u0301x.-"),
)

HYPOTHESIS_TEXT = st.lists(_piece, max_size=8).map("".join)
"""Mixed strings: scripts, combining marks, ZWJ emoji, control characters, every
Unicode whitespace, U+2581 itself, long runs of one character (never surrogates)."""



def seeded_strings(count: int, strategy: st.SearchStrategy[str] = HYPOTHESIS_TEXT,
                   per_example: int = 10) -> list[str]:
    """``count`` strings from ``strategy`` with a fixed seed (derandomized), drawn
    ``per_example`` at a time (hypothesis' cost is mostly per example). The same
    arguments give the same strings, so each set is drawn once per session (a copy each call)."""
    return list(_seeded_strings(count, strategy, per_example))


@cache
def _seeded_strings(count: int, strategy: st.SearchStrategy[str], per_example: int) -> tuple[str, ...]:
    from hypothesis import HealthCheck, given, settings

    texts: list[str] = []

    @settings(max_examples=count // per_example, derandomize=True, database=None, deadline=None,
              suppress_health_check=list(HealthCheck))
    @given(st.lists(strategy, min_size=per_example, max_size=per_example))
    def collect(batch: list[str]) -> None:
        texts.extend(batch)

    collect()
    return tuple(texts)
