"""Engine vs transformers on tiny random configs: every architecture and head, fp32.

The reference runs each sequence alone (batch of one, no padding), so any
cross-sequence leak or position error in our packed batch shows up as a diff.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
import transformers

from embedserve.engine import Batch, Engine

LENGTHS = [1, 2, 7, 33, 128, 300, 512]
TOLERANCE = 1e-5


def random_sequences(lengths: list[int], vocab: int, seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    # ids 0..3 are specials; XLM-R's pad id (1) inside content would change HF's positions.
    return [rng.integers(4, vocab, size=n).astype(np.int32) for n in lengths]


def hf_model(model_dir: Path) -> torch.nn.Module:
    config = transformers.AutoConfig.from_pretrained(model_dir)
    cls = getattr(transformers, config.architectures[0])
    return cls.from_pretrained(model_dir, attn_implementation="eager").eval()


def reference(model: torch.nn.Module, sequences: list[np.ndarray], pooling: str,
              token_types: list[np.ndarray] | None = None) -> np.ndarray:
    rows = []
    with torch.no_grad():
        for i, ids in enumerate(sequences):
            kwargs = {"input_ids": torch.from_numpy(ids.astype(np.int64))[None]}
            if token_types is not None:
                kwargs["token_type_ids"] = torch.from_numpy(token_types[i].astype(np.int64))[None]
            out = model(**kwargs)
            if hasattr(out, "logits"):
                rows.append(out.logits[0, 0].numpy())
            elif pooling == "cls":
                rows.append(out.last_hidden_state[0, 0].numpy())
            else:
                rows.append(out.last_hidden_state[0].mean(0).numpy())
    return np.stack(rows)


@pytest.mark.parametrize("fixture", ["tiny_bert_dir", "tiny_xlmr_dir"])
def test_embeddings_match_transformers(fixture: str, request: pytest.FixtureRequest) -> None:
    model_dir = request.getfixturevalue(fixture)
    with Engine.load(model_dir) as engine:
        sequences = random_sequences(LENGTHS, engine.info.vocab_size, seed=1)
        ours = engine.step(Batch.from_sequences(sequences)).wait()
        expected = reference(hf_model(model_dir), sequences, engine.info.pooling)
    assert ours.shape == (len(LENGTHS), engine.info.dimension) and ours.dtype == np.float32
    assert np.abs(ours - expected).max() <= TOLERANCE


@pytest.mark.parametrize("fixture", ["tiny_reranker_dir", "tiny_bert_reranker_dir"])
def test_scores_match_transformers(fixture: str, request: pytest.FixtureRequest) -> None:
    model_dir = request.getfixturevalue(fixture)
    with Engine.load(model_dir) as engine:
        assert engine.info.task == "score" and engine.info.dimension == 0
        sequences = random_sequences(LENGTHS, engine.info.vocab_size, seed=2)
        ours = engine.step(Batch.from_sequences(sequences, task="score")).wait()
        expected = reference(hf_model(model_dir), sequences, "cls")
    assert ours.shape == (len(LENGTHS),)
    assert expected.std() > 0.1          # scores spread far beyond the tolerance
    assert np.abs(ours - expected).max() <= TOLERANCE


def test_bert_pairs_with_token_types_match_transformers(tiny_bert_reranker_dir: Path) -> None:
    """Cross-encoder pairs: segment A gets type 0, segment B type 1, lengths mixed."""
    rng = np.random.default_rng(3)
    sequences, types = [], []
    for len_a, len_b in [(3, 9), (20, 100), (1, 1), (60, 400)]:
        sequences.append(rng.integers(4, 250002, size=len_a + len_b).astype(np.int32))
        types.append(np.r_[np.zeros(len_a), np.ones(len_b)].astype(np.int32))
    lengths = np.array([len(s) for s in sequences], dtype=np.int32)
    batch = Batch.from_lengths(np.concatenate(sequences), lengths, task="score",
                               token_type_ids=np.concatenate(types))
    with Engine.load(tiny_bert_reranker_dir) as engine:
        ours = engine.step(batch).wait()
    expected = reference(hf_model(tiny_bert_reranker_dir), sequences, "cls", types)
    assert np.abs(ours - expected).max() <= TOLERANCE
    # the token types really reach the model: all-zero types give other scores
    with Engine.load(tiny_bert_reranker_dir) as engine:
        untyped = engine.step(Batch.from_sequences(sequences, task="score")).wait()
    assert np.abs(untyped - ours).max() > 1e-2


@pytest.mark.parametrize("attention", ["per_sequence", "padded", "block_diagonal"])
def test_every_attention_layout_matches_transformers(attention: str, tiny_xlmr_dir: Path) -> None:
    with Engine.load(tiny_xlmr_dir, attention=attention) as engine:
        sequences = random_sequences([5, 64, 17], engine.info.vocab_size, seed=4)
        ours = engine.step(Batch.from_sequences(sequences)).wait()
    expected = reference(hf_model(tiny_xlmr_dir), sequences, "cls")
    assert np.abs(ours - expected).max() <= TOLERANCE
