"""A replica whose device is lost (a poisoned CUDA context) stops serving and exits.

The engine's side (telling a sticky CUDA error from a passing one) needs a GPU:
tests/gpu/test_cuda_runner.py poisons a real context. Here the engine is a real
CPU engine behind RecordingEngine, made to fail a step with ``DeviceLost`` as
the CUDA runner does, and the replica around it is real: its gRPC server,
health service and ``serve()`` life cycle.
"""

from __future__ import annotations

import asyncio
import os
import signal
import threading

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from embedserve.errors import DeviceLost
from embedserve.launch.processes import free_port
from embedserve.protos import inference_pb2_grpc
from embedserve.scheduler import cli as scheduler_cli
from embedserve.scheduler import engine_loading
from embedserve.scheduler.settings import SchedulerSettings
from scheduler_harness import RecordingEngine, ThreadedScheduler, embed_request, wait_until


def _health(port: int) -> int:
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        return stub.Check(health_pb2.HealthCheckRequest(), timeout=10).status


def test_a_lost_device_fails_the_step_turns_not_serving_and_refuses_calls(bert_engine, tiny_bert_dir):
    recorder = RecordingEngine(bert_engine)
    settings = SchedulerSettings(model_dir=tiny_bert_dir, max_batch_tokens=64)
    with ThreadedScheduler(settings, recorder) as server:
        assert _health(server.port) == health_pb2.HealthCheckResponse.SERVING
        server.stub.Embed(embed_request([[5, 6, 7]]), timeout=30)       # serves before
        recorder.fail_next = DeviceLost("the CUDA context is unusable: device-side assert")
        with pytest.raises(grpc.RpcError) as info:
            server.stub.Embed(embed_request([[5, 6]]), timeout=30)
        assert info.value.code() is grpc.StatusCode.UNAVAILABLE
        assert server.server.device_lost
        wait_until(lambda: _health(server.port) == health_pb2.HealthCheckResponse.NOT_SERVING,
                   what="NOT_SERVING")
        steps = recorder.steps
        with pytest.raises(grpc.RpcError) as info:
            server.stub.Embed(embed_request([[8, 9]]), timeout=30)
        assert info.value.code() is grpc.StatusCode.UNAVAILABLE
        assert recorder.steps == steps                                   # nothing more reached it
    recorder.close()


def test_a_passing_step_failure_keeps_the_replica_serving(bert_engine, tiny_bert_dir):
    recorder = RecordingEngine(bert_engine)
    with ThreadedScheduler(SchedulerSettings(model_dir=tiny_bert_dir), recorder) as server:
        recorder.fail_next = RuntimeError("CUDA out of memory")
        with pytest.raises(grpc.RpcError):
            server.stub.Embed(embed_request([[5, 6]]), timeout=30)
        assert not server.server.device_lost
        assert _health(server.port) == health_pb2.HealthCheckResponse.SERVING
        server.stub.Embed(embed_request([[5, 6]]), timeout=30)
    recorder.close()


def test_serve_exits_non_zero_once_the_device_is_lost(bert_engine, tiny_bert_dir, monkeypatch):
    """``embedserve scheduler``'s serve(): drains and returns EXIT_DEVICE_LOST, so that a
    supervisor restarts the process. serve() installs signal handlers, so it runs on this
    (the main) thread and the client on another."""
    recorder = RecordingEngine(bert_engine)
    recorder.close = lambda: None            # the shared engine outlives serve()'s close
    monkeypatch.setattr(engine_loading, "load_engine", lambda *args, **kwargs: recorder)
    port = free_port()
    codes: list[grpc.StatusCode] = []

    def client() -> None:
        try:
            wait_until(lambda: recorder.steps >= 1 and _serving(port), what="the replica serving")
            with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
                stub = inference_pb2_grpc.InferenceStub(channel)
                recorder.fail_next = DeviceLost("the CUDA context is unusable")
                try:
                    stub.Embed(embed_request([[5, 6]]), timeout=30)
                except grpc.RpcError as error:
                    codes.append(error.code())
        finally:
            if not codes:                    # serve() would wait forever: stop it as SIGINT does
                os.kill(os.getpid(), signal.SIGINT)

    thread = threading.Thread(target=client)
    thread.start()
    code = asyncio.run(scheduler_cli.serve(SchedulerSettings(model_dir=tiny_bert_dir, port=port)))
    thread.join(60)
    assert codes == [grpc.StatusCode.UNAVAILABLE]
    assert code == scheduler_cli.EXIT_DEVICE_LOST


def _serving(port: int) -> bool:
    try:
        return _health(port) == health_pb2.HealthCheckResponse.SERVING
    except grpc.RpcError:
        return False
