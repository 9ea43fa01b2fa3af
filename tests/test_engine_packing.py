"""Packing invariance on the default model, bf16 on CPU, and per-request post-processing."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from embedserve.engine import Batch, Engine
from embedserve.errors import InvalidInput
from embedserve.model.postprocess import postprocess_embeddings, postprocess_scores


def mixed_batch(seed: int, count: int, longest: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    # mostly short, a long tail, as requests arrive: median ~60 tokens, always one of `longest`
    lengths = np.clip(rng.lognormal(np.log(60), 0.9, size=count).astype(int), 1, longest)
    lengths[:3] = [1, 2, longest]
    return [np.r_[0, rng.integers(4, 250000, size=n - 2), 2].astype(np.int32) if n > 2
            else np.zeros(n, np.int32) for n in lengths]


@pytest.fixture(scope="module")
def e5(default_model_dir: Path):
    with Engine.load(default_model_dir) as engine:
        yield engine


def test_a_sequence_alone_equals_it_inside_a_batch_of_64(e5: Engine) -> None:
    sequences = mixed_batch(seed=7, count=64, longest=512)
    packed = e5.step(Batch.from_sequences(sequences)).wait()
    for index in (0, 1, 2, 17, 40, 63):
        alone = e5.step(Batch.from_sequences([sequences[index]])).wait()
        assert np.abs(alone[0] - packed[index]).max() <= 1e-5


def test_bf16_on_cpu_stays_close_to_fp32(default_model_dir: Path, e5: Engine) -> None:
    sequences = mixed_batch(seed=8, count=16, longest=256)
    fp32 = postprocess_embeddings(e5.step(Batch.from_sequences(sequences)).wait(), True)
    with Engine.load(default_model_dir, dtype="bfloat16") as bf16_engine:
        assert bf16_engine.info.dtype == "bfloat16"
        bf16 = postprocess_embeddings(bf16_engine.step(Batch.from_sequences(sequences)).wait(), True)
    cosine = (fp32 * bf16).sum(1)
    # Measured: min 0.99997, mean 0.99998 (here and on 90 UDHR passages alike).
    assert cosine.min() >= 0.9995, cosine.min()


@pytest.mark.parametrize("dimensions", [None, 1, 64, 384])
def test_postprocess_truncates_then_normalizes_like_torch(dimensions: int | None) -> None:
    vectors = np.random.default_rng(9).normal(size=(5, 384)).astype(np.float32)
    expected = F.normalize(torch.from_numpy(vectors)[:, :dimensions], dim=1).numpy()
    got = postprocess_embeddings(vectors, normalize=True, dimensions=dimensions)
    assert got.dtype == np.float32 and got.shape == expected.shape
    assert np.abs(got - expected).max() <= 1e-6
    raw = postprocess_embeddings(vectors, normalize=False, dimensions=dimensions)
    assert np.array_equal(raw, vectors[:, :dimensions])


def test_postprocess_keeps_zero_vectors_finite() -> None:
    assert np.array_equal(postprocess_embeddings(np.zeros((2, 4), np.float32), True), np.zeros((2, 4)))


@pytest.mark.parametrize("dimensions", [0, -1, 385])
def test_postprocess_rejects_impossible_dimensions(dimensions: int) -> None:
    with pytest.raises(InvalidInput, match="dimensions must lie in") as info:
        postprocess_embeddings(np.ones((1, 384), np.float32), True, dimensions)
    assert info.value.field == "dimensions"


def test_scores_sigmoid_matches_torch_even_at_extremes() -> None:
    logits = np.array([-1000.0, -30.0, -1.5, 0.0, 2.0, 40.0, 1000.0], np.float32)
    expected = torch.sigmoid(torch.from_numpy(logits)).numpy()
    got = postprocess_scores(logits, apply_sigmoid=True)
    assert np.isfinite(got).all() and np.abs(got - expected).max() <= 1e-7
    assert np.array_equal(postprocess_scores(logits, apply_sigmoid=False), logits)
