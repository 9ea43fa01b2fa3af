"""The CUDA-graph cache policy with a fake capture backend, and the padded forward on CPU.

The fake backend records what the cache asked for; the CPU backend runs the
real padded forward (graphs/buckets.py) and "captures" by keeping a closure, so the
math a CUDA graph replays is checked against the unpadded engine here.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from embedserve.engine import Batch, Engine
from embedserve.engine.graphs.buckets import bucket_forward, bucket_inputs
from embedserve.engine.graphs.cache import GraphCache
from embedserve.engine.graphs.shapes import BucketKey, bucket_for, reachable_buckets, sequence_bucket, token_bucket


class FakeBackend:
    def __init__(self, fail_capture: set[BucketKey] | None = None,
                 sizes: dict[int, int] | None = None) -> None:
        self.calls: list[tuple[str, BucketKey]] = []
        self.released: list[BucketKey] = []
        self.fail_capture = fail_capture or set()
        self.sizes = sizes or {}                 # bucket tokens -> graph bytes (default 1)

    def run_eager(self, key: BucketKey, inputs: object) -> tuple[str, object]:
        self.calls.append(("eager", key))
        return "eager", inputs

    def capture(self, key: BucketKey, inputs: object) -> str:
        self.calls.append(("capture", key))
        if key in self.fail_capture:
            raise RuntimeError("capture failed")
        return f"graph{key.tokens}x{key.sequences}"

    def replay(self, key: BucketKey, graph: str, inputs: object) -> tuple[str, object]:
        self.calls.append(("replay", key))
        assert graph == f"graph{key.tokens}x{key.sequences}"
        return "replay", inputs

    def release(self, key: BucketKey, graph: str) -> None:
        self.released.append(key)

    def nbytes(self, graph: str) -> int:
        return self.sizes.get(int(graph[5:].split("x")[0]), 1)


@pytest.mark.parametrize("tokens, bucket", [(1, 64), (64, 64), (65, 128), (1000, 1024), (1024, 1024),
                                            (1025, 1280), (1280, 1280), (1281, 1536), (4000, 4096)])
def test_token_buckets(tokens: int, bucket: int) -> None:
    assert token_bucket(tokens) == bucket


@pytest.mark.parametrize("sequences, bucket", [(1, 1), (2, 2), (3, 4), (5, 8), (33, 64), (64, 64)])
def test_sequence_buckets(sequences: int, bucket: int) -> None:
    assert sequence_bucket(sequences) == bucket


def test_bucket_never_has_more_sequences_than_tokens() -> None:
    assert bucket_for(60, 60) == BucketKey(64, 64)
    assert bucket_for(40, 33) == BucketKey(64, 64)


def test_warm_up_then_capture_then_replay() -> None:
    backend = FakeBackend()
    cache = GraphCache(backend)
    results = [cache.run(100, 3, f"step{i}")[0] for i in range(4)]
    key = BucketKey(128, 4)
    assert results == ["eager", "replay", "replay", "replay"]
    assert backend.calls == [("eager", key), ("capture", key), ("replay", key),
                             ("replay", key), ("replay", key)]
    stats = cache.stats()
    assert (stats["eager_runs"], stats["captures"], stats["replays"]) == (1, 1, 3)
    assert stats["padding_waste"] == pytest.approx(28 / 128)


def test_inputs_reach_the_backend_on_every_path() -> None:
    cache = GraphCache(FakeBackend())
    assert [cache.run(10, 1, i)[1] for i in range(3)] == [0, 1, 2]


def test_buckets_are_independent() -> None:
    backend = FakeBackend()
    cache = GraphCache(backend)
    assert [cache.run(t, 1, None)[0] for t in (10, 200, 20, 210)] == ["eager", "eager", "replay", "replay"]
    assert cache.cached_keys == [BucketKey(64, 1), BucketKey(256, 1)]


def test_least_recently_used_graph_is_evicted_and_recaptured() -> None:
    backend = FakeBackend()
    cache = GraphCache(backend, max_graphs=2)
    a, b, c = BucketKey(64, 1), BucketKey(128, 1), BucketKey(192, 1)
    for tokens in (60, 60, 120, 120, 60, 180, 180):    # a, b captured; a used again; c evicts b
        cache.run(tokens, 1, None)
    assert backend.released == [b]
    assert cache.cached_keys == [a, c]
    cache.run(120, 1, None)                             # b was seen: recaptured at once, evicts a
    assert backend.calls[-2:] == [("capture", b), ("replay", b)]
    assert backend.released == [b, a]
    assert cache.stats()["evictions"] == 2 and cache.stats()["graphs"] == 2


def test_memory_cap_evicts_least_recently_used_graphs() -> None:
    backend = FakeBackend(sizes={64: 300, 128: 500, 192: 400})
    cache = GraphCache(backend, max_bytes=1000)
    a, b, c = BucketKey(64, 1), BucketKey(128, 1), BucketKey(192, 1)
    for tokens in (60, 60, 120, 120, 60):            # a + b = 800 bytes, a used last
        cache.run(tokens, 1, None)
    assert cache.stats()["graph_bytes"] == 800
    cache.run(180, 1, None)
    cache.run(180, 1, None)                          # c (400) would make 1200: b goes
    assert backend.released == [b]
    assert cache.cached_keys == [a, c] and cache.stats()["graph_bytes"] == 700
    assert cache.stats()["evictions"] == 1


def test_a_graph_larger_than_the_cap_runs_eagerly_for_good() -> None:
    backend = FakeBackend(sizes={64: 300, 128: 5000})
    cache = GraphCache(backend, max_bytes=1000)
    cache.run(10, 1, None)
    cache.run(10, 1, None)
    assert [cache.run(100, 1, None)[0] for _ in range(4)] == ["eager"] * 4
    assert backend.released == [BucketKey(128, 1)]
    assert cache.cached_keys == [BucketKey(64, 1)]
    stats = cache.stats()
    assert (stats["too_large"], stats["captures"], stats["graph_bytes"]) == (1, 2, 300)


@pytest.mark.parametrize("max_tokens, max_sequences", [(512, 256), (512, 64), (1300, 16), (64, 1)])
def test_reachable_buckets_are_every_shape_a_step_can_take(max_tokens: int, max_sequences: int) -> None:
    every = {bucket_for(t, s) for t in range(1, max_tokens + 1) for s in range(1, min(t, max_sequences) + 1)}
    assert reachable_buckets(max_tokens, max_sequences) == sorted(every)


def test_failed_capture_falls_back_to_eager_for_good() -> None:
    key = BucketKey(64, 1)
    backend = FakeBackend(fail_capture={key})
    cache = GraphCache(backend)
    assert [cache.run(10, 1, None)[0] for _ in range(4)] == ["eager"] * 4
    assert [c for c in backend.calls if c[0] == "capture"] == [("capture", key)]
    assert cache.stats()["capture_failures"] == 1


def test_oversized_steps_always_run_eagerly() -> None:
    backend = FakeBackend()
    cache = GraphCache(backend, max_tokens=1024, max_sequences=16)
    assert [cache.run(2000, 2, None)[0] for _ in range(3)] == ["eager"] * 3
    assert [cache.run(100, 32, None)[0] for _ in range(3)] == ["eager"] * 3
    assert cache.stats()["captures"] == 0


def test_graphs_disabled_means_eager_only() -> None:
    cache = GraphCache(FakeBackend(), max_tokens=0)
    assert [cache.run(10, 1, None)[0] for _ in range(3)] == ["eager"] * 3


def test_capture_time_is_counted_with_an_injected_clock() -> None:
    ticks = iter([10.0, 10.5])
    cache = GraphCache(FakeBackend(), clock=lambda: next(ticks))
    cache.run(10, 1, None)
    cache.run(10, 1, None)
    assert cache.stats()["capture_time_s"] == pytest.approx(0.5)


def test_clear_releases_every_graph() -> None:
    backend = FakeBackend()
    cache = GraphCache(backend)
    for tokens in (10, 10, 100, 100):
        cache.run(tokens, 1, None)
    cache.clear()
    assert sorted(backend.released) == [BucketKey(64, 1), BucketKey(128, 1)]
    assert cache.cached_keys == []


class CpuClosureBackend:
    """Runs the real padded forward; a "graph" is a closure over its static input."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    def _forward(self, key: BucketKey, flat: torch.Tensor) -> torch.Tensor:
        with torch.inference_mode():
            return bucket_forward(self.engine.model, flat, key, self.engine.info.pooling)

    def run_eager(self, key, inputs):
        return self._forward(key, torch.from_numpy(inputs))

    def capture(self, key, inputs):
        static = torch.zeros(inputs.shape[0], dtype=torch.int64)
        return static, lambda: self._forward(key, static)

    def replay(self, key, graph, inputs):
        static, run = graph
        static.copy_(torch.from_numpy(inputs))
        return run()

    def release(self, key, graph) -> None:
        pass

    def nbytes(self, graph) -> int:
        return 0


@pytest.mark.parametrize("fixture", ["tiny_bert_dir", "tiny_xlmr_dir", "tiny_reranker_dir"])
def test_padded_bucket_forward_equals_unpadded(fixture: str, request: pytest.FixtureRequest) -> None:
    """Eager, capture and replay of padded buckets give the unpadded engine's output."""
    model_dir: Path = request.getfixturevalue(fixture)
    rng = np.random.default_rng(5)
    with Engine.load(model_dir) as engine:
        cache = GraphCache(CpuClosureBackend(engine))
        task = engine.info.task
        # [512, 512, 3] (bucket 1280 x 4) takes the padded-rows layout, the rest block-diagonal
        for lengths in ([3, 50, 7], [9, 2, 40], [300, 5, 1, 1, 12], [64], [1], [512, 512, 3], [40] * 60):
            sequences = [rng.integers(4, 250002, size=n).astype(np.int32) for n in lengths]
            batch = Batch.from_sequences(sequences, task=task)
            expected = engine.step(batch).wait()
            key = bucket_for(batch.num_tokens, batch.num_sequences)
            inputs = bucket_inputs(batch, key, engine.config.position_offset)
            for _ in range(3):                       # eager, capture + replay, replay
                got = cache.run(batch.num_tokens, batch.num_sequences, inputs)[:len(lengths)].numpy()
                assert np.abs(got - expected).max() <= 1e-5
        stats = cache.stats()
        assert stats["captures"] >= 3 and stats["replays"] >= 6 and stats["padding_waste"] > 0
