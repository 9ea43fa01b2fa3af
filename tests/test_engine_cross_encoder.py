"""BERT cross-encoders: the engine's scores of (query, document) pairs with segment ids
against sentence-transformers' CrossEncoder on the same directory.

A tiny random ``BertForSequenceClassification`` (one label) with a WordPiece
vocabulary written here; pairs are tokenized by transformers' own tokenizer
for that vocabulary, which gives ``[CLS] q [SEP] d [SEP]`` with token type 0
for the query part and 1 for the document part.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from embedserve.engine.batch import Batch
from embedserve.engine.engine import Engine

WORDS = ("what is the capital of france paris city river seine population large small "
         "how many people live in berlin germany a an and or not green tree water blue sky "
         "why does it rain clouds cool air condense into drops").split()
PAIRS = [
    ("what is the capital of france", "paris is the capital of france"),
    ("what is the capital of france", "berlin is in germany"),
    ("how many people live in berlin", "berlin is a large city"),
    ("why does it rain", "clouds cool and water drops condense"),
    ("why does it rain", "the sky is blue"),
    ("green tree", "a small green tree by the river seine and many people in the city of paris"),
    ("water", "water"),
    ("capitalization unknownword", "parisian rivers"),       # word pieces and [UNK]
]


def _write_wordpiece_vocab(path: Path) -> int:
    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    letters = [chr(c) for c in range(ord("a"), ord("z") + 1)]
    vocab = specials + sorted(set(WORDS)) + letters + [f"##{c}" for c in letters] + ["##s", "##ian"]
    path.write_text("\n".join(dict.fromkeys(vocab)) + "\n")
    return len(dict.fromkeys(vocab))


@pytest.fixture(scope="module")
def cross_encoder_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    import transformers

    directory = tmp_path_factory.mktemp("bert_cross_encoder")
    vocab_size = _write_wordpiece_vocab(directory / "vocab.txt")
    tokenizer = transformers.BertTokenizerFast(vocab_file=str(directory / "vocab.txt"), do_lower_case=True)
    tokenizer.save_pretrained(directory)
    config = transformers.BertConfig(vocab_size=vocab_size, hidden_size=32, num_hidden_layers=2,
                                     num_attention_heads=4, intermediate_size=64, type_vocab_size=2,
                                     max_position_embeddings=128, num_labels=1,
                                     # logits spread far beyond the tolerance; type embeddings matter
                                     initializer_range=0.25)
    torch.manual_seed(7)
    transformers.BertForSequenceClassification(config).eval().save_pretrained(directory)
    return directory


def _tokenized_pairs(model_dir: Path) -> tuple[list[list[int]], list[list[int]]]:
    import transformers

    tokenizer = transformers.AutoTokenizer.from_pretrained(model_dir)
    encoded = tokenizer([q for q, _ in PAIRS], [d for _, d in PAIRS])
    return encoded["input_ids"], encoded["token_type_ids"]


def _engine_scores(engine: Engine, ids: list[list[int]], types: list[list[int]] | None) -> np.ndarray:
    lengths = np.array([len(s) for s in ids])
    flat_types = None if types is None else np.concatenate([np.asarray(t) for t in types])
    batch = Batch.from_lengths(np.concatenate([np.asarray(s) for s in ids]), lengths, "score", flat_types)
    return engine.step(batch).wait()


@pytest.mark.parametrize("attention", ["per_sequence", "padded", "block_diagonal"])
def test_scores_equal_cross_encoder_predict(cross_encoder_dir: Path, attention: str) -> None:
    from sentence_transformers import CrossEncoder

    reference = CrossEncoder(str(cross_encoder_dir), device="cpu")
    expected = reference.predict(PAIRS, activation_fn=torch.nn.Identity(), convert_to_numpy=True)
    ids, types = _tokenized_pairs(cross_encoder_dir)
    assert all(0 in t and 1 in t for t in types)          # every pair has both segments
    with Engine.load(cross_encoder_dir, attention=attention) as engine:
        assert engine.info.task == "score" and engine.info.type_vocab_size == 2
        got = _engine_scores(engine, ids, types)
        zeroed = _engine_scores(engine, ids, None)
    assert got.shape == (len(PAIRS),) and got.dtype == np.float32
    np.testing.assert_allclose(got, expected, rtol=0, atol=2e-5)
    # Segment ids matter: dropping them moves every score far beyond the tolerance,
    # so a path that lost them would fail the comparison above.
    assert np.abs(zeroed - expected).min() > 1e-3
