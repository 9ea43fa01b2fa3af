"""The gateway's gRPC server's life cycle (gateway/grpc_server.py), in process on 127.0.0.1:0.

No models: what is checked is what happens around the calls. Before the app's
models are started a call is UNAVAILABLE with a retry hint; from the start of a
drain health says NOT_SERVING and new calls are UNAVAILABLE (draining) while the
HTTP side's drain counts the ones admitted; a port already taken is a one-line
start-up error.
"""

from __future__ import annotations

import asyncio
import socket
from pathlib import Path
from types import SimpleNamespace

import grpc
import pytest
from google.rpc import error_details_pb2
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_status import rpc_status
from prometheus_client import CollectorRegistry

from embedserve.gateway.draining import DRAINING_MESSAGE, Drain
from embedserve.gateway.grpc_server import GrpcApiServer
from embedserve.gateway.metrics import GatewayMetrics
from embedserve.gateway.settings import GatewaySettings
from embedserve.protos import embeddings_pb2 as pb
from embedserve.protos import embeddings_pb2_grpc


def _server(port: int = 0, api_key: str | None = None) -> tuple[GrpcApiServer, Drain]:
    drain = Drain(CollectorRegistry(), retry_after_s=1)
    # The server reads only app.state: the drain, the metrics and (once started) the router.
    app = SimpleNamespace(state=SimpleNamespace(drain=drain, metrics=GatewayMetrics()))
    settings = GatewaySettings(model_dir=Path("."), upstreams=(), grpc_port=port, api_key=api_key)
    return GrpcApiServer(app, settings), drain  # type: ignore[arg-type]


def _retry_seconds(error: grpc.aio.AioRpcError) -> int:
    for detail in rpc_status.from_call(error).details:
        if detail.Is(error_details_pb2.RetryInfo.DESCRIPTOR):
            info = error_details_pb2.RetryInfo()
            detail.Unpack(info)
            return info.retry_delay.seconds
    raise AssertionError("no RetryInfo")


def test_calls_before_start_and_during_a_drain_are_unavailable_with_a_retry_hint() -> None:
    async def scenario() -> None:
        server, drain = _server()
        port = await server.start()
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
                stub = embeddings_pb2_grpc.EmbeddingsStub(channel)
                health = health_pb2_grpc.HealthStub(channel)
                check = health_pb2.HealthCheckRequest(service="embedserve.v1.Embeddings")
                assert (await health.Check(check)).status == health_pb2.HealthCheckResponse.SERVING
                with pytest.raises(grpc.aio.AioRpcError) as starting:
                    await stub.Info(pb.ServiceInfoRequest(), timeout=10)
                assert starting.value.code() == grpc.StatusCode.UNAVAILABLE
                assert "starting" in starting.value.details() and _retry_seconds(starting.value) == 1

                drain.begin()
                await server.draining()
                assert (await health.Check(check)).status == health_pb2.HealthCheckResponse.NOT_SERVING
                with pytest.raises(grpc.aio.AioRpcError) as draining:
                    await stub.Embed(pb.EmbedTextsRequest(inputs=["x"]), timeout=10)
                assert draining.value.code() == grpc.StatusCode.UNAVAILABLE
                assert draining.value.details() == DRAINING_MESSAGE
                # A stream stays open; each new message is answered with the refusal.
                answers = [a async for a in stub.EmbedStream(
                    [pb.EmbedTextsRequest(inputs=["x"]), pb.EmbedTextsRequest(inputs=["y"])],
                    timeout=10)]
                assert [(a.index, a.error.code, a.error.reason) for a in answers] == \
                    [(i, grpc.StatusCode.UNAVAILABLE.value[0], "unavailable") for i in (0, 1)]
                assert drain.in_flight == 0
        finally:
            await server.stop(0)

    asyncio.run(scenario())


def test_the_api_key_is_checked_before_anything_else() -> None:
    async def scenario() -> None:
        server, _ = _server(api_key="k")
        port = await server.start()
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
                stub = embeddings_pb2_grpc.EmbeddingsStub(channel)
                with pytest.raises(grpc.aio.AioRpcError) as refused:
                    await stub.Info(pb.ServiceInfoRequest(), timeout=10)
                assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
                with pytest.raises(grpc.aio.AioRpcError) as admitted:   # past the key: not started
                    await stub.Info(pb.ServiceInfoRequest(), timeout=10,
                                    metadata=(("authorization", "Bearer k"),))
                assert admitted.value.code() == grpc.StatusCode.UNAVAILABLE
        finally:
            await server.stop(0)

    asyncio.run(scenario())


def test_a_port_in_use_is_a_one_line_start_up_error() -> None:
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    try:
        async def scenario() -> None:
            server, _ = _server(port=taken.getsockname()[1])
            try:
                await server.start()
            finally:
                await server.stop(0)

        with pytest.raises(SystemExit) as caught:
            asyncio.run(scenario())
        assert str(caught.value).startswith("--grpc-port: cannot listen on 127.0.0.1:")
        assert "\n" not in str(caught.value)
    finally:
        taken.close()
