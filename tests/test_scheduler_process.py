"""`embedserve scheduler` as a real process: start-up line, SIGTERM under load, clean exit."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import urllib.request

import grpc
import numpy as np
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from embedserve.cli import build_parser, main
from embedserve.engine import Batch, Engine
from embedserve.entrypoint import SCHEDULER_LISTENING
from embedserve.link import wire
from embedserve.protos import inference_pb2, inference_pb2_grpc
from scheduler_harness import embed_request, random_sequences, wait_until


def port_of(address: str) -> int:
    return int(address.rsplit(":", 1)[1])


def metric(port: int, name: str) -> float:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    match = re.search(rf"^{re.escape(name)} (\S+)$", text, re.MULTILINE)
    return float(match.group(1)) if match else 0.0


@pytest.fixture
def scheduler_process(tiny_bert_dir):
    # One sequence per step makes the load last long enough to signal mid-way.
    with subprocess.Popen(
            [sys.executable, "-m", "embedserve.cli", "scheduler", "--model", str(tiny_bert_dir),
             "--port", "0", "--metrics-port", "0", "--max-batch-sequences", "1",
             "--dtype", "float32"],   # the answers are checked against Engine.load's float32
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) as process:
        try:
            line = process.stdout.readline()
            match = SCHEDULER_LISTENING.search(line)
            assert match, f"no ready line: {line!r} {process.stderr.read() if process.poll() else ''}"
            yield process, port_of(match.group(1)), port_of(match.group(2))
        finally:
            if process.poll() is None:
                process.kill()
            process.wait(30)


def test_sigterm_mid_load_loses_no_call_and_refuses_new_ones(scheduler_process, tiny_bert_dir):
    process, port, metrics_port = scheduler_process
    rng = np.random.default_rng(7)
    calls = [random_sequences(rng, 20, 8, 64) for _ in range(30)]
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = inference_pb2_grpc.InferenceStub(channel)
        futures = [stub.Embed.future(embed_request(seqs), timeout=120) for seqs in calls]

        def admitted() -> float:
            answered = 'embedserve_scheduler_calls_total{code="OK",method="Embed"}'
            return (metric(metrics_port, "embedserve_scheduler_active_calls")
                    + metric(metrics_port, answered))

        wait_until(lambda: admitted() == 30, what="all 30 calls admitted")
        pending = sum(not f.done() for f in futures)
        process.send_signal(signal.SIGTERM)
        assert pending > 0, "the load finished before SIGTERM; the test proves nothing"
        health = health_pb2_grpc.HealthStub(channel)

        def refusing() -> bool:
            try:
                reply = health.Check(health_pb2.HealthCheckRequest(), timeout=5)
            except grpc.RpcError as error:  # drained and closed already
                return error.code() is grpc.StatusCode.UNAVAILABLE
            return reply.status == health_pb2.HealthCheckResponse.NOT_SERVING

        wait_until(refusing, what="health NOT_SERVING after SIGTERM")
        with pytest.raises(grpc.RpcError) as info:
            stub.Embed(embed_request([[5, 6, 7]]), timeout=10)
        assert info.value.code() is grpc.StatusCode.UNAVAILABLE
        results = [wire.tensor_to_array(f.result().embeddings) for f in futures]
    assert process.wait(60) == 0
    assert "stopped" in process.stderr.read()
    engine = Engine.load(tiny_bert_dir)
    try:
        for seqs, got in zip(calls, results):
            expected = engine.step(Batch.from_sequences(seqs)).wait()
            np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)
    finally:
        engine.close()


def test_flags_build_frozen_settings_with_a_device_dependent_budget(tmp_path):
    import dataclasses

    from embedserve.cli import build_parser
    from embedserve.scheduler.cli import settings_from_args
    from embedserve.scheduler.settings import (
        CPU_BF16_MAX_BATCH_TOKENS,
        CPU_MAX_BATCH_TOKENS,
        GPU_MAX_BATCH_TOKENS,
        default_max_batch_tokens,
    )

    parser = build_parser()
    args = parser.parse_args(["scheduler", "--model", str(tmp_path), "--port", "0",
                              "--metrics-port", "9100", "--max-queue-tokens", "4096"])
    settings = settings_from_args(args, tmp_path)
    assert (settings.port, settings.metrics_port, settings.max_queue_tokens) == (0, 9100, 4096)
    assert settings.max_batch_tokens is None          # chosen once the engine's dtype is known
    with pytest.raises(dataclasses.FrozenInstanceError):
        settings.port = 1
    assert default_max_batch_tokens("cpu", "float32") == CPU_MAX_BATCH_TOKENS == 512
    assert default_max_batch_tokens("cpu", "bfloat16") == CPU_BF16_MAX_BATCH_TOKENS == 1024
    assert default_max_batch_tokens("cuda", "bfloat16") == GPU_MAX_BATCH_TOKENS
    explicit = parser.parse_args(["scheduler", "--device", "cuda", "--max-batch-tokens", "2048"])
    assert settings_from_args(explicit, tmp_path).max_batch_tokens == 2048
    with pytest.raises(ValueError, match="in_flight_depth must be >= 1"):   # built other than by the CLI
        dataclasses.replace(settings, in_flight_depth=0)


def test_without_model_it_serves_the_default_model(default_model_dir):
    command = [sys.executable, "-m", "embedserve.cli", "scheduler", "--port", "0",
               "--cache-dir", str(default_model_dir.parent)]
    with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          text=True) as process:
        try:
            line = process.stdout.readline()
            match = SCHEDULER_LISTENING.search(line)
            assert match and match.group(2) == "off", f"no ready line: {line!r}"
            with grpc.insecure_channel(match.group(1)) as channel:
                info = inference_pb2_grpc.InferenceStub(channel).Info(
                    inference_pb2.InfoRequest(), timeout=30)
            assert (info.model_id, info.dimension, info.max_positions) == (
                default_model_dir.name, 384, 512)
            process.send_signal(signal.SIGTERM)
            assert process.wait(60) == 0
        finally:
            if process.poll() is None:
                process.kill()
                process.wait(30)


@pytest.mark.parametrize("value, expected", [("0", 0), ("50052", 50052), ("off", None)])
def test_frame_port_flag_takes_a_port_or_off(value, expected, tmp_path):
    from embedserve.scheduler.cli import settings_from_args
    args = build_parser().parse_args(["scheduler", "--frame-port", value])
    assert settings_from_args(args, tmp_path).frame_port == expected


@pytest.mark.parametrize("value", ["65536", "-1", "none"])
def test_a_frame_port_outside_the_range_is_a_usage_error(value, capsys):
    with pytest.raises(SystemExit) as exited:
        main(["scheduler", "--frame-port", value])
    assert exited.value.code == 2
    assert "--frame-port:" in capsys.readouterr().err


@pytest.mark.parametrize("flag", ["--max-batch-tokens", "--max-batch-sequences", "--max-queue-tokens",
                                  "--in-flight"])
def test_a_batching_bound_below_one_is_a_usage_error(flag, capsys):
    with pytest.raises(SystemExit) as exited:
        main(["scheduler", flag, "0"])
    assert exited.value.code == 2
    assert f"{flag}: must be at least 1, got 0" in capsys.readouterr().err
