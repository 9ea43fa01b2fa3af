"""hf mode's copy loops for runs of non-ASCII characters (Precompiled, the pre-tokenizer) against tokenizers.

The loop copies characters that no charsmap rule starts with and that do not join the
next character in a grapheme cluster; it must hand over to the general path exactly
where that acts differently: at a character with a rule (fullwidth forms, ligatures,
compatibility characters, a no-break space), at a character a combining mark or a
joiner follows and that some key starts with (the cluster is looked up whole), in a
cluster of characters no key starts with at one that has a rule or is outside the BMP
(each character is looked up alone), at a 4-byte character, at ASCII, and at the end
of the text. Each text puts such a character inside, at the start and at
the end of a non-Latin run.
"""

from __future__ import annotations

import pytest
import tokenizers
from tokenizers import pre_tokenizers

from conftest import shared_file
from embedserve.tokenizer import Tokenizer
from trained_tokenizers import unigram_metaspace

BREAKERS = ["Ａ", "ﬁ", "½", "\u00a0", "е\u0301", "е\u0308", "а\u200dб", "😀", "𝐀", "a", " ", "，", "ｶ\u0301",
            "\u1100\u1161", "क\u093c", "कि", "\u0e01\u0e33", "\u3000", "Ⅻ", "㎏",
            # Clusters that start with a character no key starts with, a later one with a
            # rule (U+0344, U+0340), outside the BMP (U+1D167), a joiner in a conjunct.
            "म\u0344", "मि\U0001d167", "人\u0340", "ष्\u200dट", "म\u093f\u0344\u0301"]
RUNS = ["привет", "人人生而自由", "ყველა", "Όλοι", "मनुष्य", "ß"]
TEXTS = [f"{run}{b}{run}" for run in RUNS for b in BREAKERS] + [f"{b}{run}" for run in RUNS for b in BREAKERS] \
    + [f"{run} {run}{b}" for run in RUNS for b in BREAKERS] + RUNS


@pytest.mark.parametrize("source", ["project", "xlmr/tokenizer.json"])
def test_nonascii_runs_match_tokenizers(source, xlmr_tokenizer_dir):
    # The project-made XLM-R tokenizer.json and XLM-R's own (different charsmaps).
    path = xlmr_tokenizer_dir / "tokenizer.json" if source == "project" else shared_file(source)
    ours = Tokenizer.from_file(path, cache_dir=None)
    reference = tokenizers.Tokenizer.from_file(str(path))
    got = {text: ours.encode(text).tolist() for text in TEXTS}
    expected = {text: reference.encode(text).ids for text in TEXTS}
    assert got == expected
    batch = ours.encode_batch(TEXTS)  # the run kernel (encode_run) takes the same path
    assert [batch.sequence(i).tolist() for i in range(len(TEXTS))] == [expected[t] for t in TEXTS]


# The pre-tokenizer's copy loop (pretokenize_hf.py) copies characters that are neither
# whitespace nor start with the replacement's first byte; it must stop at every
# whitespace character above ASCII (WhitespaceSplit splits there), at "▁", at a space
# and at the end. No normalizer here, so those characters reach the pre-tokenizer.
WHITESPACE = ["\u0085", "\u00a0", "\u1680", "\u2000", "\u2007", "\u200a", "\u2028", "\u2029", "\u202f", "\u205f",
              "\u3000", "\t", "\u2581", " ", "\u2581\u2581", "  "]
NEIGHBOURS = ["\u00e9", "\u00c2", "\u1e00", "\u2030", "\u20ac", "\u3001", "😀", "x"]  # C2/C3, E1, E2, E3 leads
PRE_TOKENIZER_TEXTS = [f"{run}{ws}{run}" for run in RUNS for ws in WHITESPACE] \
    + [f"{ws}{run}{n}{ws}" for run in RUNS[:3] for ws in WHITESPACE for n in NEIGHBOURS]


@pytest.mark.parametrize("whitespace_split", [False, True])
def test_pre_tokenizer_copy_loop_stops_where_tokenizers_splits(tmp_path, whitespace_split):
    path = unigram_metaspace(tmp_path / "tokenizer.json", lowercase=False)
    if whitespace_split:
        reference = tokenizers.Tokenizer.from_file(str(path))
        reference.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.WhitespaceSplit(),
                                                           pre_tokenizers.Metaspace()])
        reference.save(str(path))
    ours = Tokenizer.from_file(path, cache_dir=None)
    reference = tokenizers.Tokenizer.from_file(str(path))
    assert {t: ours.encode(t).tolist() for t in PRE_TOKENIZER_TEXTS} == \
        {t: reference.encode(t).ids for t in PRE_TOKENIZER_TEXTS}
