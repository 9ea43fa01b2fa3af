"""Generate embedserve/tokenizer/kernels/_grapheme_data.py: grapheme break properties as ranges.

Hugging Face's ``Precompiled`` normalizer walks extended grapheme clusters with the
Rust crate ``unicode-segmentation``; tokenizers 0.23.3 links version 1.13.3, whose
tables are Unicode 17.0. No UCD of that version is installable offline here (Debian's
``unicode-data`` is 15.0), so the properties are read from the same crate, 1.13.3,
through the PyPI binding ``unicode-segmentation-rs==1.0.0`` (the generator checks the
version string inside the binary): each code point is classified by where the crate
puts cluster boundaries in a handful of two- and three-character probes built on the
UAX #29 rules (GB3-GB13). Where Debian's 15.0 UCD is present, the result is compared
with its GraphemeBreakProperty.txt and the differences are printed (they are the code
points whose property changed or that were assigned in 15.1-17.0).

Run (the binding is needed only here, never at run time)::

    pip install --target /tmp/useg unicode-segmentation-rs==1.0.0
    PYTHONPATH=/tmp/useg python scripts/gen_grapheme_data.py
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import unicode_segmentation_rs as useg

OUT = Path(__file__).resolve().parent.parent / "embedserve" / "tokenizer" / "kernels" / "_grapheme_data.py"
CRATE = "unicode-segmentation-1.13.3"
UCD_GCB = Path("/usr/share/unicode/auxiliary/GraphemeBreakProperty.txt")

# Must match embedserve/tokenizer/kernels/graphemes.py.
OTHER, CR, LF, CONTROL, EXTEND, ZWJ, RI, PREPEND, SPACINGMARK, L, V, T, LV, LVT = range(14)
NAMES = ["Other", "CR", "LF", "Control", "Extend", "ZWJ", "Regional_Indicator", "Prepend",
         "SpacingMark", "L", "V", "T", "LV", "LVT"]
EXTPICT_BIT = 1 << 4
INCB_SHIFT = 5  # 2 bits: 0 none, 1 Consonant, 2 Extend, 3 Linker
INCB_CONSONANT, INCB_EXTEND, INCB_LINKER = 1, 2, 3

SEP = "\x01"  # a Control: a boundary on both sides, whatever its neighbours
KA, VIRAMA, HANGUL_L, HANGUL_V, HANGUL_T = "\u0915", "\u094d", "\u1100", "\u1161", "\u11a8"
PICT, ZWJ_CHAR, RI_A = "\u261d", "\u200d", "\U0001f1e6"


def check_crate_version() -> None:
    binary = Path(useg.__file__).parent.glob("*.so")
    blob = b"".join(path.read_bytes() for path in binary)
    if CRATE.encode() not in blob:
        sys.exit(f"unicode-segmentation-rs does not embed {CRATE}; install ==1.0.0")


def joined(probes: list[str], sep: str) -> list[bool]:
    """For each probe string: is it one grapheme cluster (no inner boundary)?"""
    clusters = useg.graphemes(sep.join(probes), True)
    result, count = [], 0
    for cluster in clusters:
        if cluster == sep:
            result.append(count == 1)
            count = 0
        else:
            count += 1
    result.append(count == 1)
    assert len(result) == len(probes)
    return result


def classify(chars: list[str], sep: str = SEP) -> list[int]:
    """Property bytes of ``chars`` (none of which may be ``sep``)."""
    def probe(template: str) -> list[bool]:
        head, tail = template.split("C")
        return joined([head + c + tail for c in chars], sep)

    after_a = probe("aC")            # Extend, ZWJ, SpacingMark (GB9, GB9a)
    before_a = probe("Ca")           # Prepend (GB9b)
    before_mark = probe("C\u0300")   # false only for Control, CR, LF (GB4)
    after_cr = probe("\rC")          # LF (GB3)
    after_l = probe(HANGUL_L + "C")  # L, V, LV, LVT (GB6)
    after_v = probe(HANGUL_V + "C")  # V, T (GB7)
    after_t = probe(HANGUL_T + "C")  # T (GB8)
    before_l = probe("C" + HANGUL_L)  # L (GB6)
    before_v = probe("C" + HANGUL_V)  # L, LV, V (GB6, GB7)
    before_ri = probe("C" + RI_A)    # RI (GB12)
    pict_zwj = probe("C" + ZWJ_CHAR + PICT)          # Extended_Pictographic (GB11)
    zwj_between = probe(PICT + "C" + PICT)           # ZWJ (GB11)
    extend_run = probe(PICT + "C" + ZWJ_CHAR + PICT)  # Extend, not SpacingMark (GB11)
    consonant = probe("C" + VIRAMA + KA)              # InCB=Consonant (GB9c)
    linker = probe(KA + "C" + KA)                     # InCB=Linker (GB9c)
    incb_extend = probe(KA + VIRAMA + "C" + KA)       # InCB=Extend or Linker (GB9c)

    props = []
    for i, c in enumerate(chars):
        if c == "\r":
            gcb = CR
        elif after_cr[i]:
            gcb = LF
        elif not before_mark[i]:
            gcb = CONTROL
        elif after_a[i]:
            gcb = ZWJ if zwj_between[i] else EXTEND if extend_run[i] else SPACINGMARK
        elif before_a[i]:
            gcb = PREPEND
        elif before_ri[i]:
            gcb = RI
        elif after_t[i]:
            gcb = T
        elif after_v[i]:
            gcb = V
        elif before_l[i]:
            gcb = L
        elif after_l[i]:
            gcb = LV if before_v[i] else LVT
        else:
            gcb = OTHER
        value = gcb
        if pict_zwj[i] and gcb not in (CONTROL, CR, LF, PREPEND):
            value |= EXTPICT_BIT
        if consonant[i] and gcb not in (CONTROL, CR, LF):
            value |= INCB_CONSONANT << INCB_SHIFT
        elif linker[i]:
            value |= INCB_LINKER << INCB_SHIFT
        elif incb_extend[i]:
            value |= INCB_EXTEND << INCB_SHIFT
        props.append(value)
    return props


def compare_with_ucd(props: dict[int, int]) -> None:
    if not UCD_GCB.exists():
        print("no Debian UCD to compare with")
        return
    version = re.search(r"GraphemeBreakProperty-([\d.]+)\.txt", UCD_GCB.read_text()[:200])
    ucd = {}
    for line in UCD_GCB.read_text().splitlines():
        line = line.split("#")[0].strip()
        if not line:
            continue
        cps, name = (part.strip() for part in line.split(";"))
        lo, _, hi = cps.partition("..")
        for cp in range(int(lo, 16), int(hi or lo, 16) + 1):
            ucd[cp] = name
    diffs = [cp for cp in props if NAMES[props[cp] & 15] != ucd.get(cp, "Other")]
    print(f"vs UCD {version.group(1) if version else '?'}: {len(diffs)} code points differ, e.g. "
          + ", ".join(f"U+{cp:04X} {ucd.get(cp, 'Other')}->{NAMES[props[cp] & 15]}" for cp in diffs[:12]))


def main() -> None:
    check_crate_version()
    cps = [cp for cp in range(0x110000) if not 0xD800 <= cp <= 0xDFFF]
    values = classify([chr(cp) for cp in cps if cp != ord(SEP)])
    props = dict(zip([cp for cp in cps if cp != ord(SEP)], values))
    props[ord(SEP)] = classify([SEP], sep="\x02")[0]
    compare_with_ucd(props)
    starts, range_values = [], []
    previous = -1
    for cp in range(0x110000):
        value = props.get(cp, OTHER)
        if value != previous:
            starts.append(cp)
            range_values.append(value)
            previous = value
    lines = [
        '"""Grapheme break properties, generated by scripts/gen_grapheme_data.py. Do not edit.',
        "",
        f"Source: the {CRATE} crate (Unicode 17.0), the version tokenizers 0.23.3 links.",
        "RANGE_STARTS[i] is the first code point of a run whose property byte is",
        "RANGE_VALUES[i]: bits 0-3 Grapheme_Cluster_Break, bit 4 Extended_Pictographic,",
        'bits 5-6 Indic_Conjunct_Break (see graphemes.py).\n"""',
        "",
        "UNICODE_VERSION = (17, 0, 0)",
        "",
        "RANGE_STARTS = (",
    ]
    lines += ["    " + ", ".join(str(s) for s in starts[i:i + 12]) + "," for i in range(0, len(starts), 12)]
    lines += [")", "", "RANGE_VALUES = ("]
    lines += ["    " + ", ".join(str(v) for v in range_values[i:i + 24]) + ","
              for i in range(0, len(range_values), 24)]
    lines += [")", ""]
    OUT.write_text("\n".join(lines))
    print(f"wrote {OUT} with {len(starts)} ranges")


if __name__ == "__main__":
    main()
