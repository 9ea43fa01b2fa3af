"""The gateway's public gRPC server: ``embedserve.v1.Embeddings``, health and reflection.

Owns the grpc.aio server behind ``--grpc-port``: its options (the largest
request message it takes is the HTTP side's ``--max-body-bytes``; a larger
one is refused RESOURCE_EXHAUSTED by gRPC before it is parsed), binding,
``grpc.health.v1`` (SERVING while the gateway takes calls, NOT_SERVING from
the start of a drain; the service name ``embedserve.v1.Embeddings`` and ""
alike) and server reflection (so ``grpcurl`` needs no .proto files). Health
and reflection are open; the API methods take the HTTP side's API key
(``grpc_api.py``). The entry point (``cli.serve_http``) starts it beside the
HTTP server, tells it when the drain begins and stops it last.
"""

from __future__ import annotations

import grpc
from fastapi import FastAPI
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from embedserve.gateway.grpc_api import SERVICE, EmbeddingsService
from embedserve.gateway.settings import GatewaySettings
from embedserve.protos import embeddings_pb2_grpc

_HEALTH_NAMES = ("", SERVICE)


class GrpcApiServer:
    """The public gRPC API of one gateway app, bound by ``start``."""

    def __init__(self, app: FastAPI, settings: GatewaySettings) -> None:
        state = app.state
        self.service = EmbeddingsService(lambda: getattr(state, "router", None), state.drain,
                                         state.metrics, settings.api_key, settings.max_inputs,
                                         settings.max_body_bytes, getattr(state, "tracer", None),
                                         settings.batch_api_keys)
        host = f"[{settings.host}]" if ":" in settings.host else settings.host
        self._address = f"{host}:{settings.grpc_port}"
        self.health = health.aio.HealthServicer()
        self.server = grpc.aio.server(options=[
            # Set, not left to gRPC's 4 MiB default: one limit on a request's size
            # for both transports (docs/grpc-api.md).
            ("grpc.max_receive_message_length", settings.max_body_bytes),
            # An answer's size follows from the request (inputs x width x types, bounded
            # by --max-inputs); a cap would refuse it only after the work was done.
            ("grpc.max_send_message_length", -1),
            # A port already taken is an error, not a second listener sharing it.
            ("grpc.so_reuseport", 0)])
        embeddings_pb2_grpc.add_EmbeddingsServicer_to_server(self.service, self.server)
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self.server)
        reflection.enable_server_reflection((SERVICE, health.SERVICE_NAME, reflection.SERVICE_NAME),
                                            self.server)
        self.port = 0

    async def start(self) -> int:
        """Bind and serve; the bound port. SystemExit (one line) when the port cannot be bound."""
        try:
            self.port = self.server.add_insecure_port(self._address)
        except RuntimeError:
            self.port = 0
        if self.port == 0:
            raise SystemExit(f"--grpc-port: cannot listen on {self._address} (in use, or not an "
                             "address of this machine)")
        await self.server.start()
        await self._set_health(health_pb2.HealthCheckResponse.SERVING)
        return self.port

    async def draining(self) -> None:
        """The gateway stops admitting calls: probes see NOT_SERVING, calls UNAVAILABLE."""
        await self._set_health(health_pb2.HealthCheckResponse.NOT_SERVING)

    async def stop(self, grace_s: float) -> None:
        """Close the port; calls still running get ``grace_s`` before they are cut."""
        await self._set_health(health_pb2.HealthCheckResponse.NOT_SERVING)
        await self.server.stop(grace_s)

    async def _set_health(self, status: int) -> None:
        for name in _HEALTH_NAMES:
            await self.health.set(name, status)
