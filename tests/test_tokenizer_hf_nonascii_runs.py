"""hf mode's copy loop for runs of 2- and 3-byte characters (Precompiled) against tokenizers.

The loop copies characters that no charsmap rule starts with and that do not join the
next character in a grapheme cluster; it must hand over to the general path exactly
where that acts differently: at a character with a rule (fullwidth forms, ligatures,
compatibility characters, a no-break space), at a character a combining mark or a
joiner follows (the cluster is looked up whole), at a 4-byte character, at ASCII, and
at the end of the text. Each text puts such a character inside, at the start and at
the end of a non-Latin run.
"""

from __future__ import annotations

import pytest
import tokenizers

from conftest import shared_file
from embedserve.tokenizer import Tokenizer

BREAKERS = ["Ａ", "ﬁ", "½", "\u00a0", "е\u0301", "е\u0308", "а\u200dб", "😀", "𝐀", "a", " ", "，", "ｶ\u0301",
            "\u1100\u1161", "क\u093c", "कि", "\u0e01\u0e33", "\u3000", "Ⅻ", "㎏"]
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
