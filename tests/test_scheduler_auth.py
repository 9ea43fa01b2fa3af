"""Replica authentication (embedserve/link/auth.py, embedserve/link/token_file.py), end to end.

A real ``embedserve scheduler`` process started with ``--replica-token-file``
(tiny random BERT): calls without the token or with a wrong one are
refused with UNAUTHENTICATED, whatever the method's kind (unary Info and
Embed, streaming reflection); the health service answers without it; the
right token is served. A real gateway with the token answers 200 (the
token travels on each call it makes: Info, Embed, Ranges); one without it
is never ready and answers 503 saying why, not 500.
"""

from __future__ import annotations

import argparse
import stat
import time
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from embedserve.link.token_file import read_token_file, replica_token_from_args, temporary_token_file
from embedserve.protos import inference_pb2, inference_pb2_grpc
from gateway_harness import GatewayServer, SchedulerProcess, gateway_settings
from scheduler_harness import embed_request

TOKEN = "s3cret-replica-token"


@pytest.fixture(scope="module")
def token_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("token") / "replica-token"
    path.write_text(TOKEN + "\n")   # a trailing newline, as `echo` writes it
    return path


@pytest.fixture(scope="module")
def replica(tiny_bert_dir: Path, token_file: Path):
    process = SchedulerProcess(tiny_bert_dir, "--replica-token-file", str(token_file), threads=1)
    yield process
    process.stop()


@pytest.fixture
def channel(replica: SchedulerProcess):
    with grpc.insecure_channel(replica.address) as opened:
        yield opened


def _code(call, *args, **kwargs) -> grpc.StatusCode:
    with pytest.raises(grpc.RpcError) as raised:
        call(*args, **kwargs)
    return raised.value.code()


@pytest.mark.parametrize("metadata", [None, (("authorization", "Bearer wrong"),),
                                      (("authorization", TOKEN),),              # no "Bearer "
                                      (("authorization", f"Bearer {TOKEN}x"),)],
                         ids=["none", "wrong", "no-scheme", "longer"])
def test_calls_without_the_right_token_are_unauthenticated(channel, metadata) -> None:
    stub = inference_pb2_grpc.InferenceStub(channel)
    assert _code(stub.Info, inference_pb2.InfoRequest(), metadata=metadata, timeout=30) == \
        grpc.StatusCode.UNAUTHENTICATED
    assert _code(stub.Embed, embed_request([[0, 10, 2]]), metadata=metadata, timeout=30) == \
        grpc.StatusCode.UNAUTHENTICATED


def test_streaming_methods_are_refused_too(channel) -> None:
    reflection = reflection_pb2_grpc.ServerReflectionStub(channel)
    replies = reflection.ServerReflectionInfo(iter([reflection_pb2.ServerReflectionRequest(list_services="")]),
                                              timeout=30)
    assert _code(list, replies) == grpc.StatusCode.UNAUTHENTICATED


def test_the_right_token_is_served(channel) -> None:
    stub = inference_pb2_grpc.InferenceStub(channel)
    metadata = (("authorization", f"Bearer {TOKEN}"),)
    assert stub.Info(inference_pb2.InfoRequest(), metadata=metadata, timeout=30).dimension == 32
    reply = stub.Embed(embed_request([[0, 10, 2], [0, 11, 12, 2]]), metadata=metadata, timeout=30)
    assert list(reply.embeddings.shape) == [2, 32]


def test_health_stays_open_for_probes(channel) -> None:
    health = health_pb2_grpc.HealthStub(channel)
    reply = health.Check(health_pb2.HealthCheckRequest(service=""), timeout=30)
    assert reply.status == health_pb2.HealthCheckResponse.SERVING


def test_gateway_with_the_token_answers(tiny_bert_dir: Path, replica: SchedulerProcess) -> None:
    gateway = GatewayServer(gateway_settings(tiny_bert_dir, [replica.address], replica_token=TOKEN))
    try:
        gateway.wait_ready()
        with gateway.client() as client:
            reply = client.post("/v1/embeddings", json={"input": ["a", "b"]})
            # Ranges is the one other replica call the gateway makes (Info it made to get ready).
            ranges = client.get("/v1/quantization/ranges")
        assert reply.status_code == 200, reply.text
        assert [len(item["embedding"]) for item in reply.json()["data"]] == [32, 32]
        assert ranges.status_code == 200, ranges.text
        assert ranges.json()["dimensions"] == 32
    finally:
        gateway.stop()


@pytest.mark.parametrize("token", [None, "not-the-token"], ids=["no-token", "wrong-token"])
def test_gateway_without_the_token_says_so(tiny_bert_dir: Path, replica: SchedulerProcess,
                                           token: str | None) -> None:
    gateway = GatewayServer(gateway_settings(tiny_bert_dir, [replica.address], replica_token=token,
                                             health_backoff_max_s=0.2))
    try:
        statuses, message = [], ""
        with gateway.client() as client:
            # The replica's health is open, its Info is not: the gateway learns of the
            # refusal on its first Info call and keeps the replica out of rotation.
            deadline = time.monotonic() + 60
            while "token" not in message and time.monotonic() < deadline:
                reply = client.post("/v1/embeddings", json={"input": "x"})
                statuses.append(reply.status_code)
                message = reply.json()["error"]["message"]
                time.sleep(0.05)
            assert client.get("/ready").status_code == 503
        assert "token" in message, message
        assert set(statuses) == {503}, statuses
    finally:
        gateway.stop()


def test_token_file_is_private_and_removed_afterwards() -> None:
    with temporary_token_file() as path:
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
        assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
        token = read_token_file(path)
        assert len(token) >= 32
        with temporary_token_file() as other:
            assert read_token_file(other) != token
    assert not path.exists() and not path.parent.exists()


def test_token_from_flag_then_environment(tmp_path: Path) -> None:
    flag_file, env_file, empty = tmp_path / "flag", tmp_path / "env", tmp_path / "empty"
    flag_file.write_text("from-flag")
    env_file.write_text(" from-env \n")
    empty.write_text("\n")
    environ = {"EMBEDSERVE_REPLICA_TOKEN_FILE": str(env_file)}
    assert replica_token_from_args(argparse.Namespace(replica_token_file=flag_file), environ) == "from-flag"
    assert replica_token_from_args(argparse.Namespace(replica_token_file=None), environ) == "from-env"
    assert replica_token_from_args(argparse.Namespace(replica_token_file=None), {}) is None
    # A token file that is named but unusable stops the command: starting open would be silent.
    for unusable in (empty, tmp_path / "missing"):
        with pytest.raises(SystemExit, match="replica-token-file"):
            replica_token_from_args(argparse.Namespace(replica_token_file=unusable), {})
