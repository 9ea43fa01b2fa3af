"""Translate gRPC failures from replicas into the embedserve error set.

The boundary where foreign exceptions become ours: the dispatcher calls
``from_rpc_error`` on every ``grpc.aio.AioRpcError`` and decides on retries
with ``is_retryable``; nothing above the dispatcher sees a gRPC type.
"""

from __future__ import annotations

import grpc

from embedserve import errors

# Codes that say "this replica failed", not "this request is bad": the chunk
# is worth another replica. RESOURCE_EXHAUSTED is retried too (another replica
# may have room). DEADLINE_EXCEEDED and INVALID_ARGUMENT are final.
RETRYABLE_CODES = frozenset({
    grpc.StatusCode.UNAVAILABLE,
    grpc.StatusCode.UNKNOWN,
    grpc.StatusCode.INTERNAL,
    grpc.StatusCode.CANCELLED,
    grpc.StatusCode.RESOURCE_EXHAUSTED,
    grpc.StatusCode.ABORTED,
})

# Codes after which the replica is taken out until its health watch says
# SERVING again (connection refused or reset, replica draining or killed).
REPLICA_DOWN_CODES = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.UNKNOWN})


def is_retryable(code: grpc.StatusCode) -> bool:
    return code in RETRYABLE_CODES


def from_rpc_error(code: grpc.StatusCode, details: str | None) -> errors.EmbedServeError:
    message = details or code.name.lower()
    if code == grpc.StatusCode.INVALID_ARGUMENT:
        return errors.InvalidInput(message)
    if code == grpc.StatusCode.RESOURCE_EXHAUSTED:
        return errors.Overloaded(f"replicas are overloaded: {message}")
    if code == grpc.StatusCode.UNAVAILABLE:
        return errors.Unavailable(f"no replica could serve the request: {message}")
    if code == grpc.StatusCode.UNAUTHENTICATED:
        # The gateway's replica token is missing or wrong: a deployment error,
        # the same on every replica, so not retried; the client sees 503.
        return errors.Unavailable("a replica refused the gateway's credentials "
                                  "(the gateway's --replica-token-file must match the replicas')")
    if code == grpc.StatusCode.DEADLINE_EXCEEDED:
        return errors.DeadlineExceeded("the request timed out")
    if code == grpc.StatusCode.CANCELLED:
        # Our own cancellations surface as asyncio.CancelledError, never as an
        # RpcError; a CANCELLED status therefore came from the replica side
        # (shutting down), which is the replica being unavailable.
        return errors.Unavailable(f"the replica cancelled the call: {message}")
    return errors.EmbedServeError(f"replica error ({code.name}): {message}")
