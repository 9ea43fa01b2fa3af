"""The CUDA runner under the load a replica gives it: graphs, buckets, memory, failure.

With a ``small`` multilingual-e5 shape in bfloat16 (bench/gpu/models.py). The
reference for every answer is the same engine with graphs off (each step eager at
its exact shape), so a misrouted, stale or mixed-up answer shows as a mismatch.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch

from bench.gpu.models import write_model
from embedserve.engine import Batch, Engine
from embedserve.model.cuda_options import CudaOptions

VOCAB = 4096           # the small scale's vocabulary
# Replay at a padded bucket vs eager at the exact shape: other GEMM shapes, so other
# summation orders, in bf16 (8 mantissa bits): compared by cosine, not bit for bit.
MIN_COSINE = 0.999


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_model(tmp_path_factory.mktemp("e5"), "multilingual-e5-small", "small", device="cuda")


@pytest.fixture(scope="module")
def eager(model_dir: Path):
    with Engine.load(model_dir, device="cuda", dtype="bfloat16", cuda_graphs=False) as engine:
        yield engine


def _batch(rng: np.random.Generator, lengths: list[int]) -> Batch:
    return Batch.from_sequences([rng.integers(3, VOCAB, size=n).astype(np.int32) for n in lengths])


def _assert_same(got: np.ndarray, expected: np.ndarray) -> None:
    assert got.shape == expected.shape
    cosine = (got * expected).sum(-1) / (np.linalg.norm(got, axis=-1) * np.linalg.norm(expected, axis=-1))
    assert cosine.min() >= MIN_COSINE, cosine.min()


def test_many_length_mixes_replay_through_one_bucket(model_dir: Path, eager: Engine) -> None:
    rng = np.random.default_rng(1)
    mixes = [[64], [32, 32], [1, 63], [10, 20, 30, 4], [1, 1, 1, 61], [50, 7, 7]]   # all bucket (64, 4)
    with Engine.load(model_dir, device="cuda", dtype="bfloat16") as graphs:
        for lengths in mixes:
            batch = _batch(rng, lengths)
            _assert_same(graphs.step(batch).wait(), eager.step(batch).wait())
        stats = graphs.stats()
    assert stats["captures"] == 1 and stats["replays"] == len(mixes) - 1


def test_steps_in_flight_across_buckets_while_capturing(model_dir: Path, eager: Engine) -> None:
    """200 steps issued before any is awaited, over many buckets (so captures happen
    between replays): every answer is its own request's."""
    rng = np.random.default_rng(2)
    batches = [_batch(rng, list(rng.integers(1, 120, size=rng.integers(1, 9)))) for _ in range(200)]
    with Engine.load(model_dir, device="cuda", dtype="bfloat16") as graphs:
        pending = [graphs.step(batch) for batch in batches]
        answers = [lazy.wait() for lazy in pending]
        stats = graphs.stats()
    assert stats["captures"] >= 2 and stats["replays"] >= 100
    for batch, answer in zip(batches, answers):
        _assert_same(answer, eager.step(batch).wait())


def test_capture_at_start_captures_every_reachable_bucket(model_dir: Path) -> None:
    options = CudaOptions(graph_tokens=256, graph_sequences=8, capture_at_start=True)
    with Engine.load(model_dir, device="cuda", dtype="bfloat16", cuda=options) as engine:
        captured = engine.stats()["captures"]
        engine.step(_batch(np.random.default_rng(3), [100, 20])).wait()
        stats = engine.stats()
    assert captured >= 8
    assert stats["captures"] == captured and stats["replays"] >= 1 + captured


def test_eviction_and_recapture_with_a_count_cap(model_dir: Path, eager: Engine) -> None:
    rng = np.random.default_rng(4)
    shapes = [[60], [120], [200], [60]]          # three buckets, the first one again after eviction
    with Engine.load(model_dir, device="cuda", dtype="bfloat16", cuda=CudaOptions(max_graphs=2)) as engine:
        for lengths in shapes:
            batch = _batch(rng, lengths)
            for _ in range(2):                   # eager, then capture + replay
                _assert_same(engine.step(batch).wait(), eager.step(batch).wait())
        stats = engine.stats()
    assert stats["graphs"] == 2 and stats["evictions"] >= 1 and stats["captures"] >= 4


def test_the_memory_cap_bounds_reserved_memory(model_dir: Path) -> None:
    """--graph-memory bounds what the device reserves for graphs: with the engine loaded and
    its eager memory returned (empty_cache), what stays reserved after each capture is the
    graphs' private pools, and it never exceeds the cap, however many buckets are captured."""
    rng = np.random.default_rng(5)
    cap = 64 << 20
    options = CudaOptions(graph_memory_bytes=cap)
    with Engine.load(model_dir, device="cuda", dtype="bfloat16", cuda=options) as engine:
        engine.step(_batch(rng, [512])).wait()  # eager: the caching allocator's, returned below
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        baseline = torch.cuda.memory_reserved()   # weights and the runner's own buffers
        for tokens in (64, 128, 192, 256, 320, 384, 448, 512):
            batch = _batch(rng, [tokens])
            engine.step(batch).wait()           # eager
            engine.step(batch).wait()           # capture + replay
            torch.cuda.synchronize()
            torch.cuda.empty_cache()
            assert engine.stats()["graph_bytes"] <= cap
            assert torch.cuda.memory_reserved() - baseline <= cap
        stats = engine.stats()
    assert stats["captures"] >= 1


def test_an_oversized_step_runs_eagerly(model_dir: Path, eager: Engine) -> None:
    batch = _batch(np.random.default_rng(6), [500, 500, 300])    # beyond graph_tokens (512)
    with Engine.load(model_dir, device="cuda", dtype="bfloat16") as engine:
        for _ in range(3):
            _assert_same(engine.step(batch).wait(), eager.step(batch).wait())
        stats = engine.stats()
    assert stats["captures"] == 0 and stats["eager_runs"] == 3


def test_a_poisoned_context_turns_every_later_step_into_device_lost(model_dir: Path) -> None:
    """A device-side assert poisons the CUDA context: the runner must report DeviceLost
    (which makes the scheduler go NOT_SERVING and exit, tests/test_scheduler_device_lost.py)
    for the failing step and every later one, not hang. In a child process: the context
    cannot be used again."""
    script = textwrap.dedent(f"""
        import numpy as np, torch
        from embedserve.engine import Batch, Engine
        from embedserve.errors import DeviceLost
        engine = Engine.load({str(model_dir)!r}, device="cuda", dtype="bfloat16")
        batch = Batch.from_sequences([np.arange(3, 40, dtype=np.int32)])
        engine.step(batch).wait()
        index = torch.tensor([10**6], device="cuda")
        torch.zeros(4, device="cuda")[index] += 1        # out of bounds: a device-side assert
        outcomes = []
        for _ in range(2):
            try:
                engine.step(batch).wait(timeout=60)
                outcomes.append("answered")
            except DeviceLost:
                outcomes.append("device_lost")
            except Exception as error:
                outcomes.append(type(error).__name__)
        print("OUTCOMES", outcomes, engine.stats()["device_lost"])
    """)
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    line = next((s for s in result.stdout.splitlines() if s.startswith("OUTCOMES")), "")
    assert line == "OUTCOMES ['device_lost', 'device_lost'] 1.0", result.stdout + result.stderr[-2000:]
