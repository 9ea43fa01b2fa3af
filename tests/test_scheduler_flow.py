"""Flow control through a real server: cancellation, deadlines, overload, draining, failures.

The engine is a real tiny BERT behind ``RecordingEngine``, which records
every sequence it is asked to step and can hold steps behind a gate. With
the in-flight depth at 2, two gated calls fill the engine and anything sent
after them waits in the scheduler's queue, where these tests act on it.
"""

from __future__ import annotations

import grpc
import numpy as np
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from embedserve.engine import Batch
from embedserve.errors import InvalidInput
from embedserve.link import wire
from embedserve.protos import inference_pb2_grpc
from embedserve.scheduler.settings import SchedulerSettings
from scheduler_harness import RecordingEngine, ThreadedScheduler, embed_request, wait_until

QUEUED = "embedserve_scheduler_queue_sequences"


@pytest.fixture
def gated(bert_engine, tiny_bert_dir):
    """A server whose engine is held shut, with two calls already filling it."""
    recorder = RecordingEngine(bert_engine)
    settings = SchedulerSettings(model_dir=tiny_bert_dir, max_batch_tokens=64, in_flight_depth=2,
                                 max_queue_tokens=600)
    with ThreadedScheduler(settings, recorder) as server:
        recorder.gate.clear()
        blockers = []
        for _ in range(2):  # one at a time, so each is a step of its own
            steps_before = recorder.steps
            blockers.append(server.stub.Embed.future(embed_request([[5, 6, 7]]), timeout=60))
            wait_until(lambda: recorder.steps == steps_before + 1, what="a step in the engine")
        yield server, recorder, blockers
        recorder.gate.set()
    recorder.close()


def marked(marker: int, count: int = 3, length: int = 5) -> list[list[int]]:
    """Sequences whose ids contain ``marker``, so the record shows whether they ran."""
    return [[marker] * length for _ in range(count)]


def ran(recorder: RecordingEngine, marker: int) -> bool:
    return any(marker in sequence for sequence in recorder.stepped)


def finish(server, recorder, blockers) -> None:
    """Open the gate, let everything finish, and push one more call through behind it."""
    recorder.gate.set()
    for future in blockers:
        assert list(future.result().embeddings.shape) == [1, 32]
    after = server.stub.Embed(embed_request([[9, 9, 9]]), timeout=30)
    assert list(after.embeddings.shape) == [1, 32]


def test_a_cancelled_call_is_dropped_before_compute(gated):
    server, recorder, blockers = gated
    doomed = server.stub.Embed.future(embed_request(marked(4242)), timeout=60)
    wait_until(lambda: server.server.pool.queued_sequences == 3, what="the call queued")
    doomed.cancel()
    wait_until(lambda: server.counter("embedserve_scheduler_calls_dropped_total", reason="cancelled") == 1,
               what="the server to see the cancellation")
    finish(server, recorder, blockers)
    assert not ran(recorder, 4242)
    assert server.counter("embedserve_scheduler_sequences_dropped_total", reason="cancelled") == 3
    assert server.counter("embedserve_scheduler_calls_total", method="Embed", code="CANCELLED") == 1
    assert server.server.pool.queued_tokens == 0


def test_a_call_past_its_deadline_is_dropped_before_compute(gated):
    server, recorder, blockers = gated
    late = server.stub.Embed.future(embed_request(marked(4343)), timeout=2.0)
    wait_until(lambda: server.server.pool.queued_sequences == 3, what="the call queued")
    with pytest.raises(grpc.RpcError) as info:
        late.result()
    assert info.value.code() is grpc.StatusCode.DEADLINE_EXCEEDED
    # The label is best effort: the client's own deadline cancel can reach the
    # server before the server's timer fires (see service._DEADLINE_SKEW_S).
    def dropped(metric: str) -> float:
        return sum(server.counter(metric, reason=reason) for reason in ("deadline", "cancelled"))

    wait_until(lambda: dropped("embedserve_scheduler_calls_dropped_total") == 1,
               what="the server to see the deadline")
    finish(server, recorder, blockers)
    assert not ran(recorder, 4343)
    assert dropped("embedserve_scheduler_sequences_dropped_total") == 3


def test_overload_is_resource_exhausted_at_once_then_recovers(gated):
    server, recorder, blockers = gated
    # 500 of the 600 queued tokens; the next 200-token call cannot fit.
    queued = server.stub.Embed.future(embed_request(marked(4444, count=5, length=100)), timeout=60)
    wait_until(lambda: server.server.pool.queued_tokens == 500, what="the queue to fill")
    with pytest.raises(grpc.RpcError) as info:
        server.stub.Embed(embed_request(marked(4545, count=2, length=100)), timeout=30)
    assert info.value.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "retry" in info.value.details()
    finish(server, recorder, blockers)
    assert list(queued.result().embeddings.shape) == [5, 32]
    retried = server.stub.Embed(embed_request(marked(4545, count=2, length=100)), timeout=30)
    assert list(retried.embeddings.shape) == [2, 32]
    assert server.counter("embedserve_scheduler_calls_total", method="Embed",
                          code="RESOURCE_EXHAUSTED") == 1


def test_a_call_larger_than_the_queue_bound_can_never_fit(gated):
    server, recorder, blockers = gated
    with pytest.raises(grpc.RpcError) as info:
        server.stub.Embed(embed_request(marked(4646, count=2, length=400)), timeout=30)
    # Not "retry later": it would never fit, so the caller must split it.
    assert info.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert "split" in info.value.details()
    finish(server, recorder, blockers)


def test_drain_refuses_new_calls_and_finishes_the_ones_in_flight(gated):
    server, recorder, blockers = gated
    queued = server.stub.Embed.future(embed_request(marked(4747)), timeout=60)
    wait_until(lambda: server.server.pool.queued_sequences == 3, what="the call queued")
    draining = server.submit(server.server.drain(timeout_s=30))
    health = health_pb2_grpc.HealthStub(server.channel)
    wait_until(lambda: health.Check(health_pb2.HealthCheckRequest(), timeout=5).status
               == health_pb2.HealthCheckResponse.NOT_SERVING, what="NOT_SERVING")
    with pytest.raises(grpc.RpcError) as info:
        server.stub.Embed(embed_request([[5, 6]]), timeout=10)
    assert info.value.code() is grpc.StatusCode.UNAVAILABLE
    assert not draining.done()  # three calls are still being served
    recorder.gate.set()
    assert draining.result(30) is True
    for future in [*blockers, queued]:
        assert future.result().embeddings.shape[0] in (1, 3)
    assert ran(recorder, 4747)


def test_a_failed_step_fails_its_calls_and_the_loop_keeps_running(gated, bert_engine):
    server, recorder, blockers = gated
    recorder.fail_next = RuntimeError("kernel exploded at /secret/path")
    victim = server.stub.Embed.future(embed_request(marked(4848, count=1)), timeout=60)
    wait_until(lambda: server.server.pool.queued_sequences == 1, what="the call queued")
    recorder.gate.set()
    with pytest.raises(grpc.RpcError) as info:
        victim.result()
    assert info.value.code() is grpc.StatusCode.INTERNAL
    assert "secret" not in info.value.details()
    recorder.fail_next = InvalidInput("the engine refused this batch")
    with pytest.raises(grpc.RpcError) as info:
        server.stub.Embed(embed_request([[5, 6]]), timeout=30)
    assert info.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert server.counter("embedserve_scheduler_steps_failed_total") == 2
    sequences = [[7, 8, 9], [10, 11]]
    response = server.stub.Embed(embed_request(sequences), timeout=30)
    expected = bert_engine.step(Batch.from_sequences(sequences)).wait()
    np.testing.assert_allclose(wire.tensor_to_array(response.embeddings), expected, rtol=1e-5, atol=1e-6)
    for future in blockers:
        future.result()


def test_a_long_call_is_split_across_steps_and_reassembled_in_order(gated, bert_engine):
    server, recorder, blockers = gated
    sequences = [[100 + i] * (10 + i) for i in range(12)]  # 186 tokens, budget 64 per step
    call = server.stub.Embed.future(embed_request(sequences), timeout=60)
    wait_until(lambda: server.server.pool.queued_sequences == 12, what="the call queued")
    steps_before = recorder.steps
    finish(server, recorder, blockers)
    got = wire.tensor_to_array(call.result().embeddings)
    expected = bert_engine.step(Batch.from_sequences(sequences)).wait()
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)
    assert recorder.steps - steps_before >= 1 + 186 // 64  # several steps carried it
    assert call.result().timings.compute_us > 0


def test_not_serving_and_unavailable_until_the_warm_up_step_finishes(bert_engine, tiny_bert_dir):
    import asyncio
    import threading

    from embedserve.scheduler.server import SchedulerServer

    recorder = RecordingEngine(bert_engine)
    recorder.gate.clear()  # hold the warm-up step
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    settings = SchedulerSettings(model_dir=tiny_bert_dir)
    server = asyncio.run_coroutine_threadsafe(_construct(SchedulerServer, settings, recorder), loop).result()
    starting = asyncio.run_coroutine_threadsafe(server.start(), loop)
    try:
        wait_until(lambda: recorder.steps == 1, what="the warm-up step")
        with grpc.insecure_channel(f"127.0.0.1:{server.port}") as channel:
            health = health_pb2_grpc.HealthStub(channel)
            status = health.Check(health_pb2.HealthCheckRequest(), timeout=10).status
            assert status == health_pb2.HealthCheckResponse.NOT_SERVING
            stub = inference_pb2_grpc.InferenceStub(channel)
            with pytest.raises(grpc.RpcError) as info:
                stub.Embed(embed_request([[5, 6]]), timeout=10)
            assert info.value.code() is grpc.StatusCode.UNAVAILABLE
            recorder.gate.set()
            assert starting.result(30) == server.port
            status = health.Check(health_pb2.HealthCheckRequest(), timeout=10).status
            assert status == health_pb2.HealthCheckResponse.SERVING
            assert list(stub.Embed(embed_request([[5, 6]]), timeout=30).embeddings.shape) == [1, 32]
    finally:
        recorder.gate.set()
        asyncio.run_coroutine_threadsafe(server.stop(drain_timeout_s=5), loop).result(30)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()
        recorder.close()


async def _construct(cls, *args):
    """Build an object that needs a running event loop (grpc.aio.server) on that loop."""
    return cls(*args)
