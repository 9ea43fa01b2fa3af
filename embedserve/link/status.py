"""The one mapping from embedserve errors to gRPC status codes (scheduler side).

Every class in ``embedserve.errors.ALL_ERRORS`` has an entry (a test checks
it); the most specific class wins, so ``InputTooLong`` maps through its own
entry, not ``InvalidInput``'s. Anything that is not an ``EmbedServeError``
is INTERNAL with a fixed message: its text may hold paths or tensor dumps,
so it goes to the log with its traceback, never to the client.
"""

from __future__ import annotations

import grpc

from embedserve import errors

GRPC_CODES: dict[type[errors.EmbedServeError], grpc.StatusCode] = {
    errors.EmbedServeError: grpc.StatusCode.INTERNAL,
    errors.InvalidInput: grpc.StatusCode.INVALID_ARGUMENT,
    errors.InputTooLong: grpc.StatusCode.INVALID_ARGUMENT,
    errors.ModelNotFound: grpc.StatusCode.NOT_FOUND,
    errors.Overloaded: grpc.StatusCode.RESOURCE_EXHAUSTED,
    errors.Unavailable: grpc.StatusCode.UNAVAILABLE,
    errors.DeviceLost: grpc.StatusCode.UNAVAILABLE,
    errors.DeadlineExceeded: grpc.StatusCode.DEADLINE_EXCEEDED,
    errors.Cancelled: grpc.StatusCode.CANCELLED,
    errors.ModelLoadError: grpc.StatusCode.INTERNAL,
}

INTERNAL_MESSAGE = "internal error in the scheduler (details are in its log)"


def grpc_status(error: BaseException) -> tuple[grpc.StatusCode, str]:
    """(code, client-safe message) for any exception."""
    if isinstance(error, errors.EmbedServeError):
        for cls in type(error).__mro__:
            if cls in GRPC_CODES:
                return GRPC_CODES[cls], error.message
    return grpc.StatusCode.INTERNAL, INTERNAL_MESSAGE
