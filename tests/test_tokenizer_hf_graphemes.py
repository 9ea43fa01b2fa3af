"""Grapheme clusters as tokenizers 0.23.3 cuts them, and the Precompiled quirks built on them.

Boundaries follow UAX #29 (Unicode 17.0, the tables of unicode-segmentation 1.13.3);
the cases below are the rules' own examples. The tokenizer-level tests compare with
tokenizers itself on inputs where the cluster walk decides the result.
"""

from __future__ import annotations

import pytest
import tokenizers

from conftest import shared_file
from embedserve.tokenizer import Tokenizer
from embedserve.tokenizer.kernels._grapheme_data import UNICODE_VERSION
from embedserve.tokenizer.kernels.graphemes import grapheme_ends


@pytest.mark.parametrize("text, clusters", [
    ("\r\n", ["\r\n"]),                                   # GB3
    ("a\r\nb", ["a", "\r\n", "b"]),                       # GB4, GB5
    ("\n\u0301", ["\n", "\u0301"]),                       # GB4 beats GB9
    ("\u1100\u1161\u11a8", ["\u1100\u1161\u11a8"]),      # GB6, GB7 (L V T)
    ("\uac00\u11a8\uac01\u11a8", ["\uac00\u11a8", "\uac01\u11a8"]),  # GB7 (LV T), GB8 (LVT T)
    ("a\u0301\u0302b", ["a\u0301\u0302", "b"]),           # GB9 (Extend)
    ("a\u0903", ["a\u0903"]),                             # GB9a (SpacingMark)
    ("\u0600a", ["\u0600a"]),                             # GB9b (Prepend)
    ("\u0915\u094d\u0937", ["\u0915\u094d\u0937"]),      # GB9c (Indic conjunct)
    ("\u0915\u094d\u200d\u0937", ["\u0915\u094d\u200d\u0937"]),  # GB9c through ZWJ (InCB Extend)
    ("\u1000\u1039\u1000", ["\u1000\u1039\u1000"]),      # GB9c, Myanmar linker (Unicode 16+)
    ("\u0905\u094d\u0915", ["\u0905\u094d", "\u0915"]),  # GB9c needs a consonant (Unicode 17)
    ("\U0001f468\u200d\U0001f469\u200d\U0001f467", ["\U0001f468\u200d\U0001f469\u200d\U0001f467"]),  # GB11
    ("\U0001f44d\U0001f3fd!", ["\U0001f44d\U0001f3fd", "!"]),    # skin tone is Extend
    ("a\u200d\U0001f469", ["a\u200d", "\U0001f469"]),    # GB11 needs a pictograph before
    ("\U0001f1ef\U0001f1f5\U0001f1fa\U0001f1f8\U0001f1eb",
     ["\U0001f1ef\U0001f1f5", "\U0001f1fa\U0001f1f8", "\U0001f1eb"]),  # GB12, GB13
    ("a\u1ae0", ["a\u1ae0"]),                             # a mark new in Unicode 17.0
])
def test_cluster_boundaries(text, clusters):
    ends, position = [], 0
    for cluster in clusters:
        position += len(cluster.encode("utf-8"))
        ends.append(position)
    assert grapheme_ends(text) == ends


def test_tables_are_unicode_17():
    assert UNICODE_VERSION == (17, 0, 0)


@pytest.fixture(scope="module", params=["project", "xlmr/tokenizer.json"])
def both(request, tokenizer_cache_dir, xlmr_tokenizer_dir):
    """Ours and tokenizers on one file: the project-made XLM-R tokenizer.json (always) and
    XLM-R's own from the reference data (its charsmap differs; skipped without it)."""
    if request.param == "project":
        path = xlmr_tokenizer_dir / "tokenizer.json"
    else:
        path = shared_file(request.param)
    return Tokenizer.from_file(path, cache_dir=tokenizer_cache_dir), tokenizers.Tokenizer.from_file(str(path))


@pytest.mark.parametrize("text", [
    "\uff76\u0301",              # halfwidth KA + mark: one short cluster, KA's rule wins, mark dropped
    "\u212b\u0301",              # ANGSTROM SIGN + mark: same quirk
    "\uff21\u0300x",             # fullwidth A + grave
    "\uff76\uff9e\uff77\uff9e",  # halfwidth voiced marks are Extend: 6-byte clusters, per character
    "e\u0301\u0302\u0303",       # a cluster of 6 bytes or more: each character alone
    "\u0995\u09cb",              # Bengali O: decomposed as a short cluster
    "\r\n\r\n",                  # CR LF clusters
    "\x00\u0301 a\x00b",         # the charsmap search stops at NUL
    "\ufdfa \u337b",             # one character, long replacements
])
def test_precompiled_cluster_quirks_match_tokenizers(both, text):
    ours, reference = both
    assert ours.encode(text).tolist() == reference.encode(text).ids
