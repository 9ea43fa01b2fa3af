"""Every family the engine serves, on CUDA, against the CPU engine and against itself.

At the ``small`` scale of bench/gpu/models.py (the real head size, grouping, windows
and positions; few layers) with random weights:

- CUDA float32 against CPU float32, raw pooled vectors (or scores);
- CUDA bfloat16 against CUDA float32, by cosine (or score distance);
- with graphs: a bucket's first step runs eagerly at the bucket's shape, later ones
  replay the graph captured from it: the two give the same numbers.

Each measured error is kept (conftest ``measured``) so that the bars rest on numbers.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from bench.gpu.models import SHAPES, scaled_config, write_model
from embedserve.engine import Batch, Engine

FAMILIES = ["multilingual-e5-small", "bge-base", "bge-m3", "qwen3-embedding-0.6b", "modernbert-base",
            "ms-marco-minilm", "mistral-window", "all-mpnet-base-v2", "mxbai-rerank-base",
            # last: the families added by issue 42 (RoBERTa, DistilBERT, NomicBERT, Gemma3)
            "all-roberta-large-v1", "msmarco-distilbert-base-v4", "nomic-embed-text-v1.5", "embeddinggemma-300m"]
LENGTHS = [5, 37, 128, 1, 64, 90]
# CUDA and CPU float32 differ in summation order only: relative to the output's scale,
# a few ulps of float32 per layer. Bars to be tightened from tests_measured.json.
FP32_RELATIVE = 1e-3
MIN_COSINE_FP32 = 0.99999
MIN_COSINE_BF16 = 0.99
MAX_SCORE_SHIFT_BF16 = 0.05


@pytest.fixture(scope="module", params=FAMILIES)
def family_dir(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Path]:
    name = request.param
    return name, write_model(tmp_path_factory.mktemp(name), name, "small", device="cuda")


def _batch(name: str, task: str) -> Batch:
    vocab = scaled_config(SHAPES[name], "small")["vocab_size"]
    rng = np.random.default_rng(0)
    return Batch.from_sequences([rng.integers(3, vocab, size=n).astype(np.int32) for n in LENGTHS], task=task)


def _cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return (a * b).sum(-1) / (np.linalg.norm(a, axis=-1) * np.linalg.norm(b, axis=-1))


def test_cuda_float32_matches_cpu_float32(family_dir: tuple[str, Path], measured: dict) -> None:
    name, directory = family_dir
    with Engine.load(directory, device="cpu", dtype="float32", fused_layers=False) as cpu:
        batch = _batch(name, cpu.info.task)
        expected = cpu.step(batch).wait()
    with Engine.load(directory, device="cuda", dtype="float32", cuda_graphs=False) as cuda:
        got = cuda.step(batch).wait()
    relative = float(np.abs(got - expected).max() / np.abs(expected).max())
    measured[f"{name} cuda fp32 vs cpu fp32 max relative"] = relative
    assert relative <= FP32_RELATIVE
    if expected.ndim == 2:
        cosine = float(_cosines(got, expected).min())
        measured[f"{name} cuda fp32 vs cpu fp32 min cosine"] = cosine
        assert cosine >= MIN_COSINE_FP32


def test_bfloat16_stays_close_to_float32(family_dir: tuple[str, Path], measured: dict) -> None:
    name, directory = family_dir
    with Engine.load(directory, device="cuda", dtype="float32", cuda_graphs=False) as fp32:
        batch = _batch(name, fp32.info.task)
        expected = fp32.step(batch).wait()
    with Engine.load(directory, device="cuda", dtype="bfloat16", cuda_graphs=False) as bf16:
        got = bf16.step(batch).wait()
    if expected.ndim == 2:
        cosine = float(_cosines(got, expected).min())
        measured[f"{name} bf16 vs fp32 min cosine"] = cosine
        assert cosine >= MIN_COSINE_BF16
    else:
        shift = float(np.abs(1 / (1 + np.exp(-got)) - 1 / (1 + np.exp(-expected))).max())
        measured[f"{name} bf16 vs fp32 max sigmoid shift"] = shift
        assert shift <= MAX_SCORE_SHIFT_BF16


@pytest.mark.parametrize("attention", ["varlen", "padded"])
def test_replay_equals_eager_at_the_bucket_shape(family_dir: tuple[str, Path], attention: str,
                                                 measured: dict) -> None:
    from embedserve.model.cuda_options import CudaOptions

    name, directory = family_dir
    options = CudaOptions(attention=attention)
    try:
        engine = Engine.load(directory, device="cuda", dtype="bfloat16", cuda=options)
    except ValueError as error:                    # --cuda-attention varlen where it cannot run
        pytest.skip(str(error))
    with engine:
        batch = _batch(name, engine.info.task)
        eager, captured, replayed = (engine.step(batch).wait() for _ in range(3))
        stats = engine.stats()
    assert stats["eager_runs"] >= 1 and stats["captures"] == 1 and stats["replays"] == 2
    difference = float(np.abs(replayed - eager).max())
    measured[f"{name} {attention} replay vs eager max abs"] = difference
    np.testing.assert_array_equal(captured, replayed)
    # The same kernels on the same shapes: equal but for kernels whose reduction order
    # depends on the launch (split-K choices); bf16's own resolution bounds that.
    assert difference <= 1e-2 * max(1.0, float(np.abs(eager).max()))
