"""The public gRPC API's side of the error set: status code, message and rich details.

Owns turning an ``embedserve.errors`` class into what a client of
``embedserve.v1.Embeddings`` receives. The code comes from the one gRPC table,
``embedserve/link/status.py``'s ``GRPC_CODES`` (the replica's API maps with the same
table, so both gRPC APIs agree); the reason (``input_too_long``,
``model_not_found``, ...) is HTTP's ``error.code`` from ``http_errors.py``, so
one name means one thing on both transports. Each status carries Google's
standard details (``google.rpc.Status`` in ``grpc-status-details-bin``, read
with ``grpc_status.rpc_status.from_call``):

- ``ErrorInfo``: the reason, domain ``embedserve``, and the field at fault;
- ``BadRequest``: for INVALID_ARGUMENT, the field (``inputs[3]``) and the fix;
- ``RetryInfo``: for RESOURCE_EXHAUSTED and UNAVAILABLE, when to retry.

Not to be confused with ``embedserve.link.status.from_replica_error``, which turns
a replica's failures into our errors on the way in.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import grpc
from google.protobuf import any_pb2, duration_pb2
from google.rpc import error_details_pb2, status_pb2

from embedserve import errors
from embedserve.gateway.http_errors import UNAVAILABLE_RETRY_AFTER_S, status_for
from embedserve.link.status import GRPC_CODES

DOMAIN = "embedserve"
DETAILS_KEY = "grpc-status-details-bin"
# What a client is told when the server itself failed; the traceback goes to the log.
INTERNAL_MESSAGE = "internal error in the gateway (details are in its log)"
UNAUTHENTICATED_MESSAGE = "missing or wrong API key (send 'authorization: Bearer <key>' metadata)"


@dataclass(frozen=True)
class ApiStatus:
    """One failed call's status, as the unary calls abort with and a stream message carries."""

    code: grpc.StatusCode
    message: str
    reason: str
    field: str | None = None
    fix: str | None = None
    retry_after_s: float | None = None

    def details(self) -> status_pb2.Status:
        """The ``google.rpc.Status`` with ErrorInfo, and BadRequest or RetryInfo when they apply."""
        info = error_details_pb2.ErrorInfo(reason=self.reason, domain=DOMAIN,
                                           metadata={"field": self.field} if self.field else {})
        details = [info]
        if self.code == grpc.StatusCode.INVALID_ARGUMENT and self.field:
            description = self.message if self.fix is None else f"{self.message}; {self.fix}"
            details.append(error_details_pb2.BadRequest(field_violations=[
                error_details_pb2.BadRequest.FieldViolation(field=self.field,
                                                            description=description)]))
        if self.retry_after_s is not None:
            seconds = max(1, math.ceil(self.retry_after_s))
            details.append(error_details_pb2.RetryInfo(
                retry_delay=duration_pb2.Duration(seconds=seconds)))
        packed = []
        for detail in details:
            holder = any_pb2.Any()
            holder.Pack(detail)
            packed.append(holder)
        return status_pb2.Status(code=self.code.value[0], message=self.message, details=packed)

    def trailing_metadata(self) -> tuple[tuple[str, bytes], ...]:
        return ((DETAILS_KEY, self.details().SerializeToString()),)


def api_status(error: errors.EmbedServeError) -> ApiStatus:
    """The status a client sees for ``error``, through its class hierarchy."""
    code = next(GRPC_CODES[cls] for cls in type(error).__mro__ if cls in GRPC_CODES)
    retry = None
    if isinstance(error, errors.Overloaded):
        retry = error.retry_after_s
    elif isinstance(error, errors.Unavailable):
        retry = float(UNAVAILABLE_RETRY_AFTER_S)
    return ApiStatus(code, error.message, status_for(error)[1], getattr(error, "field", None),
                     _fix(error), retry)


UNEXPECTED = ApiStatus(grpc.StatusCode.INTERNAL, INTERNAL_MESSAGE, "internal_error")
UNAUTHENTICATED = ApiStatus(grpc.StatusCode.UNAUTHENTICATED, UNAUTHENTICATED_MESSAGE,
                            "invalid_api_key")


def _fix(error: errors.EmbedServeError) -> str | None:
    """What the client can change, for the errors whose message states only the problem."""
    if not isinstance(error, errors.InputTooLong):
        return None
    if error.index is not None:   # one input longer than the model's window
        return ("shorten it, or set truncate to \"right\" or \"left\" (cut it to the window) "
                "or \"chunk\" (embed its windows and pool them)")
    return "split the inputs over several requests"

