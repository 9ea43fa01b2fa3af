"""compat="hf" character offsets equal tokenizers==0.23.3's (what TEI's ``/tokenize`` returns).

tokenizers aligns what its normalizers and pre-tokenizer change by rules of its own, which
"the source characters a byte came from" does not give; each group of texts below is one
of them (normalize_hf.py, replace_hf.py, pretokenize_hf.py). Before these rules were
followed, nine in ten UDHR lines of the shared XLM-R tokenizer.json got offsets that differed
from tokenizers' (most of them their first token, after the lines' indentation).

The tokenizer is the project-made XLM-R tokenizer.json of the default model (the same
normalizer steps and pre-tokenizer as XLM-R's own, which test_tokenizer_hf_parity.py
compares on the UDHR and emoji corpora where the reference data is present).
"""

from __future__ import annotations

import pytest
import tokenizers

from embedserve.tokenizer import Tokenizer
from test_tokenizer_hf_parity import plain, seeded_hypothesis_strings
from tokenizer_corpus import BLOCK_BREAKERS, block_edge_texts

RULES = {
    # Replace(" {2,}", " ") aligns the one space to the run's last.
    "a collapsed run of spaces is its last space": ["    Cu Assembleia", "a  b", "\u3000\u3000a", "  ", "x \t  y"],
    # Metaspace's prepend aligns "▁" to the first character (a token of its own here).
    "the prepended metaspace is the first character": ["tura", "EJUK", "word ", "\u0712\u0718\u0715"],
    # Precompiled aligns a replacement's t-th character to the cluster's t-th.
    "a composed character is its first source character": ["ta\u0303rro", "a\u0303b", "\uff76\u0301x"],
    # A deleted control lowers the change of the character written before it: one that an
    # expansion inserted (the "i" of "ﬁ" -> "fi") then takes the control's place.
    "an expansion's inserted character before a control is the control": ["\ufb01\x01x", "x\ufb01\x01\x02y",
                                                                          "\u337f\x01a"],
    # ... and with nothing written before it, every alignment after shifts back.
    "controls before any text shift every offset back": ["\x01abc", "\x01\x02\ufb01\x03x", "\x01 a", "\x7f\x7fword"],
}


@pytest.fixture(scope="module")
def pair(xlmr_tokenizer_dir, tokenizer_cache_dir) -> tuple[Tokenizer, tokenizers.Tokenizer]:
    path = xlmr_tokenizer_dir / "tokenizer.json"
    return Tokenizer.from_file(path, cache_dir=tokenizer_cache_dir), tokenizers.Tokenizer.from_file(str(path))


def offsets_of(ours: Tokenizer, reference: tokenizers.Tokenizer, texts: list[str]) -> tuple[list, list]:
    """(ours, tokenizers') ids and character offsets of each text."""
    batch = ours.encode_batch(texts, return_offsets=True)
    got = [(batch.sequence(i).tolist(), batch.sequence_offsets(i).tolist()) for i in range(len(texts))]
    expected = [(e.ids, [list(o) for o in e.offsets]) for e in reference.encode_batch(texts)]
    return got, expected


@pytest.mark.parametrize("rule", RULES)
def test_each_alignment_rule_gives_tokenizers_offsets(pair, rule):
    texts = RULES[rule]
    got, expected = offsets_of(*pair, texts)
    assert dict(zip(texts, got)) == dict(zip(texts, expected))


def test_generated_and_block_edge_texts_give_tokenizers_offsets(pair):
    texts = [t for t in seeded_hypothesis_strings(2_000) + block_edge_texts(["_", *BLOCK_BREAKERS]) if plain(t)]
    got, expected = offsets_of(*pair, texts)
    differ = [(texts[i], got[i], expected[i]) for i in range(len(texts)) if got[i] != expected[i]]
    assert not differ, f"{len(differ)} of {len(texts)} differ, e.g. {differ[:2]}"
