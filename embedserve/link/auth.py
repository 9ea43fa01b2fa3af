"""Replica authentication: a shared secret token in gRPC call metadata.

A replica's gRPC port answers whoever reaches it; without a credential a
client that reaches it skips the gateway's API keys and limits. With a
token, both sides agree on one secret (``--replica-token-file``, the same
file on the gateway and on every replica):

    scheduler  TokenAuthInterceptor refuses every call that does not carry
               ``authorization: Bearer <token>`` with UNAUTHENTICATED,
               except grpc.health.v1 (orchestrator probes carry nothing)
    gateway    ``call_metadata(token)`` is that metadata; the replica pool
               (gateway/replicas.py) holds it and passes it on every
               embedserve.v1 call it makes

Owns the protocol on both sides. Token files and the flag are
``token_file.py`` (no grpc import, for the command line); entry points
read the file and pass the token down in their settings.
The token travels in clear on an insecure channel: it keeps out clients
that are not the gateway, not an eavesdropper on the network (that needs
TLS, e.g. a service mesh).
"""

from __future__ import annotations

import hmac
from collections.abc import Awaitable, Callable

import grpc

METADATA_KEY = "authorization"
# Methods served without the token: probes must work without credentials.
OPEN_SERVICE_PREFIXES = ("/grpc.health.v1.Health/",)
_REFUSAL = "missing or wrong replica token (authorization: Bearer ...); see --replica-token-file"


def bearer(token: str) -> str:
    return f"Bearer {token}"


def call_metadata(token: str | None) -> tuple[tuple[str, str], ...]:
    """The metadata a gateway sends on every embedserve.v1 call (empty without a token).

    Passed per call, not added by a client interceptor: grpc.aio runs an
    intercepted call as one more task per call (0.2-0.4 ms of gateway CPU
    per request in ``bench overhead``).
    """
    return ((METADATA_KEY, bearer(token)),) if token else ()


class TokenAuthInterceptor(grpc.aio.ServerInterceptor):
    """Server side: UNAUTHENTICATED for any call without the token (health stays open)."""

    def __init__(self, token: str) -> None:
        self._expected = bearer(token).encode()

    async def intercept_service(
            self, continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
            details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler:
        handler = await continuation(details)
        if handler is None or details.method.startswith(OPEN_SERVICE_PREFIXES):
            return handler
        supplied = next((value for key, value in details.invocation_metadata or ()
                         if key == METADATA_KEY), "")
        supplied_bytes = supplied.encode() if isinstance(supplied, str) else bytes(supplied)
        # Constant time: the comparison must not tell a prober how much of a guess was right.
        if hmac.compare_digest(supplied_bytes, self._expected):
            return handler
        return _refusing(handler)


async def _refuse(request: object, context: grpc.aio.ServicerContext) -> None:
    await context.abort(grpc.StatusCode.UNAUTHENTICATED, _REFUSAL)


def _refusing(handler: grpc.RpcMethodHandler) -> grpc.RpcMethodHandler:
    """A handler of the same kind (unary or streaming) as ``handler`` that refuses the call."""
    make = {(False, False): grpc.unary_unary_rpc_method_handler,
            (False, True): grpc.unary_stream_rpc_method_handler,
            (True, False): grpc.stream_unary_rpc_method_handler,
            (True, True): grpc.stream_stream_rpc_method_handler}[
        (handler.request_streaming, handler.response_streaming)]
    return make(_refuse, request_deserializer=handler.request_deserializer,
                response_serializer=handler.response_serializer)
