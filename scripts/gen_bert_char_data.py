"""Generate embedserve/tokenizer/kernels/_bert_char_data.py: what BERT's normalizer and
pre-tokenizer do to each code point, as tokenizers 0.23.3 does it.

tokenizers' ``BertNormalizer`` and ``BertPreTokenizer`` mix four Unicode sources of
different ages: the ``unicode_categories`` crate (``is_other`` for clean_text,
``is_mark_nonspacing`` for strip_accents, ``is_punctuation``), Rust's std
(``char::is_whitespace``, ``char::to_lowercase``) and ``unicode-normalization-alignments``
(NFD). No single UCD reproduces that mix, so each property is read from tokenizers
itself, one code point at a time (a few seconds), through its Python binding:

- clean: ``BertNormalizer(clean_text only)`` on the character: "" (removed) or " ".
- nfd: ``normalizers.NFD`` on the character, when it changes it.
- mn: ``BertNormalizer(strip_accents only)`` on a character NFD leaves alone: "".
- ccc: the canonical combining class drives NFD's reordering; the value is Python's
  ``unicodedata.combining``, kept only where tokenizers' NFD really reorders the
  character against a probe mark (its crate may predate the character).
- lower: ``BertNormalizer(lowercase only)``, when it changes the character.
- ws / punct: ``BertPreTokenizer`` on ``"a" + c + "a"`` (2 words: a whitespace, 3: a
  punctuation character).

Run (tokenizers is a test dependency; the generated module is plain data)::

    python scripts/gen_bert_char_data.py
"""

from __future__ import annotations

import unicodedata
from pathlib import Path

import tokenizers
from tokenizers import normalizers, pre_tokenizers

OUT = Path(__file__).resolve().parent.parent / "embedserve" / "tokenizer" / "kernels" / "_bert_char_data.py"
VERSION = "0.23.3"
# Bits of RANGE_VALUES; must match kernels/normalize_bert.py.
CLEAN_DROP, CLEAN_SPACE, MN, WS, PUNCT = 1, 2, 4, 8, 16
HANGUL_FIRST, HANGUL_LAST = 0xAC00, 0xD7A3  # decomposed arithmetically (normalize_bert.py)
PROBE_LOW, PROBE_HIGH = "\u0334", "\u0345"  # combining classes 1 and 240


def code_points():
    return (c for c in range(0x110000) if not 0xD800 <= c < 0xE000)


def hangul_nfd(c: int) -> str:
    index = c - HANGUL_FIRST
    lead, vowel, trail = 0x1100 + index // 588, 0x1161 + index % 588 // 28, 0x11A7 + index % 28
    return chr(lead) + chr(vowel) + (chr(trail) if trail != 0x11A7 else "")


def bert(**flags) -> normalizers.BertNormalizer:
    options = dict(clean_text=False, handle_chinese_chars=False, strip_accents=False, lowercase=False)
    options.update(flags)
    return normalizers.BertNormalizer(**options)


def ccc_seen_by_tokenizers(ch: str, nfd: normalizers.NFD) -> int:
    value = unicodedata.combining(ch)
    if value == 0:
        return 0
    reorders = (nfd.normalize_str(ch + PROBE_LOW) == PROBE_LOW + ch if value > 1
                else nfd.normalize_str(PROBE_HIGH + ch) == ch + PROBE_HIGH)
    return value if reorders else 0


def main() -> None:
    if tokenizers.__version__ != VERSION:
        raise SystemExit(f"tokenizers {tokenizers.__version__} installed; the tables are for {VERSION}")
    clean, strip, lower = bert(clean_text=True), bert(strip_accents=True), bert(lowercase=True)
    nfd = normalizers.NFD()
    split = pre_tokenizers.BertPreTokenizer()
    flags = [0] * 0x110000
    decompositions: dict[int, tuple[int, ...]] = {}
    lowercase: dict[int, tuple[int, ...]] = {}
    combining: dict[int, int] = {}
    for c in code_points():
        ch = chr(c)
        bits = 0
        cleaned = clean.normalize_str(ch)
        if cleaned == "":
            bits |= CLEAN_DROP
        elif cleaned == " " and ch != " ":
            bits |= CLEAN_SPACE
        elif cleaned != ch:
            raise SystemExit(f"clean_text maps U+{c:04X} to {cleaned!r}")
        decomposed = nfd.normalize_str(ch)
        if HANGUL_FIRST <= c <= HANGUL_LAST:
            if decomposed != hangul_nfd(c):  # computed by the kernel, not tabulated
                raise SystemExit(f"NFD of U+{c:04X} is not the algorithmic Hangul decomposition")
        elif decomposed != ch:
            decompositions[c] = tuple(map(ord, decomposed))
        elif strip.normalize_str(ch) == "":
            bits |= MN
        lowered = lower.normalize_str(ch)
        if lowered != ch:
            lowercase[c] = tuple(map(ord, lowered))
        words = len(split.pre_tokenize_str("a" + ch + "a"))
        bits |= WS if words == 2 else PUNCT if words == 3 else 0
        value = ccc_seen_by_tokenizers(ch, nfd)
        if value:
            combining[c] = value
        flags[c] = bits
    starts, values = [0], [flags[0]]
    for c in range(1, 0x110000):
        if flags[c] != values[-1]:
            starts.append(c)
            values.append(flags[c])
    OUT.write_text(render(starts, values, decompositions, lowercase, combining), encoding="utf-8")
    print(f"{OUT}: {len(starts)} ranges, {len(decompositions)} decompositions, {len(lowercase)} lowercase "
          f"mappings, {len(combining)} combining classes")


def _rows(items: list[str], per_line: int) -> str:
    return "\n".join("    " + " ".join(items[i:i + per_line]) for i in range(0, len(items), per_line))


def render(starts, values, decompositions, lowercase, combining) -> str:
    def mapping(name: str, table: dict) -> str:
        return f"{name} = {{\n" + _rows([f"{k}: {v!r}," for k, v in sorted(table.items())], 6) + "\n}\n"

    return (
        '"""What BERT\'s normalizer and pre-tokenizer do per code point, generated by\n'
        "scripts/gen_bert_char_data.py from tokenizers " + VERSION + ". Do not edit.\n\n"
        "RANGE_STARTS[i] is the first code point of a run whose bits are RANGE_VALUES[i]:\n"
        "1 clean_text removes it, 2 clean_text makes it a space, 4 strip_accents removes it\n"
        "(a nonspacing mark), 8 whitespace (the pre-tokenizer splits there), 16 punctuation.\n"
        "DECOMPOSITIONS: NFD, where it changes the character (Hangul syllables, U+AC00..U+D7A3, are\n"
        "decomposed arithmetically instead); LOWERCASE: lowercase, where it\n"
        "changes it; COMBINING: nonzero canonical combining classes (NFD's reordering).\n"
        '"""\n\n'
        f"RANGE_STARTS = (\n{_rows([f'{s},' for s in starts], 12)}\n)\n\n"
        f"RANGE_VALUES = (\n{_rows([f'{v},' for v in values], 16)}\n)\n\n"
        + mapping("DECOMPOSITIONS", decompositions) + "\n"
        + mapping("LOWERCASE", lowercase) + "\n"
        + mapping("COMBINING", combining)
    )


if __name__ == "__main__":
    main()
