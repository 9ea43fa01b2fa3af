"""Segment ids through the scheduler: Score calls batched together keep their own.

A real scheduler (tests/scheduler_harness.py) over the tiny BERT reranker.
One step is held behind the gate so that the next calls queue up and are
concatenated into one engine batch; that batch's ``token_type_ids`` must be
the calls' own, in batch order (zeros for a call that sent none), and every
call's scores must equal a direct engine step of that call alone.
"""

from __future__ import annotations

import numpy as np
import pytest

from embedserve import ragged
from embedserve.engine import Batch, Engine
from embedserve.link import wire
from embedserve.protos import inference_pb2
from embedserve.scheduler.settings import SchedulerSettings
from scheduler_harness import RecordingEngine, ThreadedScheduler, wait_until


@pytest.fixture(scope="module")
def reranker_engine(tiny_bert_reranker_dir):
    engine = Engine.load(tiny_bert_reranker_dir)
    yield engine
    engine.close()


def _pairs(rng: np.random.Generator, count: int) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """[CLS] query [SEP] document [SEP] with segment 0, then 1."""
    pairs, types = [], []
    for _ in range(count):
        q = rng.integers(5, 1000, int(rng.integers(1, 12)))
        d = rng.integers(5, 1000, int(rng.integers(1, 30)))
        pairs.append(np.concatenate([[101], q, [102], d, [102]]).astype(np.int32))
        types.append(np.concatenate([np.zeros(len(q) + 2), np.ones(len(d) + 1)]).astype(np.int32))
    return pairs, types


def _packed(pairs: list[np.ndarray], types: list[np.ndarray] | None) -> inference_pb2.PackedTokens:
    lengths = np.array([len(p) for p in pairs])
    return wire.pack_tokens(ragged.from_lengths(np.concatenate(pairs), lengths,
                                                None if types is None else np.concatenate(types)))


def _direct(engine: Engine, pairs: list[np.ndarray], types: list[np.ndarray] | None) -> np.ndarray:
    lengths = np.array([len(p) for p in pairs])
    return engine.step(Batch.from_lengths(np.concatenate(pairs), lengths, "score",
                                          None if types is None else np.concatenate(types))).wait()


def test_batched_calls_keep_their_segment_ids(reranker_engine, tiny_bert_reranker_dir) -> None:
    rng = np.random.default_rng(11)
    recording = RecordingEngine(reranker_engine)
    # One step at a time, so calls arriving while it is held queue up for the next one.
    settings = SchedulerSettings(model_dir=tiny_bert_reranker_dir, max_batch_tokens=4096,
                                 in_flight_depth=1, metrics_port=0)
    calls = [_pairs(rng, n) for n in (2, 3, 1, 4)]
    sends_types = [True, False, True, True]       # the second call sends no segment ids
    with ThreadedScheduler(settings, recording) as server:
        warm_up_steps = recording.steps          # the server's own warm-up step
        recording.gate.clear()
        blocker_pairs, blocker_types = _pairs(rng, 1)
        blocker = server.stub.Score.future(inference_pb2.ScoreRequest(
            pairs=_packed(blocker_pairs, blocker_types)), timeout=60)
        wait_until(lambda: recording.steps == warm_up_steps + 1, what="the held step")
        futures = []
        for (pairs, types), with_types in zip(calls, sends_types):
            futures.append(server.stub.Score.future(inference_pb2.ScoreRequest(
                pairs=_packed(pairs, types if with_types else None)), timeout=60))
            # admitted in this order, so the next batch holds the calls in this order
            wait_until(lambda: server.server.pool.queued_sequences >= sum(
                len(p) for p, _ in calls[:len(futures)]), what="the call queued")
        recording.gate.set()
        results = [wire.tensor_to_array(f.result().scores) for f in futures]
        np.testing.assert_allclose(wire.tensor_to_array(blocker.result().scores),
                                   _direct(reranker_engine, blocker_pairs, blocker_types), atol=1e-6)
    assert recording.steps == warm_up_steps + 2, "the four calls should have shared one step"
    combined = recording.batches[-1]
    expected_types = np.concatenate([np.concatenate(types) if with_types
                                     else np.zeros(sum(len(p) for p in pairs), dtype=np.int32)
                                     for (pairs, types), with_types in zip(calls, sends_types)])
    np.testing.assert_array_equal(combined.token_type_ids, expected_types)
    for (pairs, types), with_types, got in zip(calls, sends_types, results):
        want = _direct(reranker_engine, pairs, types if with_types else None)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
        if with_types:   # the segment ids changed the answer: they were not dropped
            assert np.abs(got - _direct(reranker_engine, pairs, None)).min() > 1e-4
