"""The replica link's one error table, used in both directions.

A replica answers a failed call with the gRPC status of its error's class
(``grpc_status``) and names the class itself (``error_metadata``): in the
``embedserve-error`` trailing metadata over gRPC, by its number in a frame REPLY.
The gateway turns the answer back into that class (``from_replica_error``), so an
``InputTooLong`` raised by a replica is an ``InputTooLong`` (HTTP 413) at the
gateway, not a plain invalid input; a status that names no class (gRPC's own, a
refusal before the handler, a replica of an earlier release) is read by its code.
tests/test_link_errors.py round-trips every class of ``embedserve.errors`` through
a real replica over both transports.

Every class in ``embedserve.errors.ALL_ERRORS`` has a row (a test checks it); the
most specific class wins, so ``InputTooLong`` maps through its own row, not
``InvalidInput``'s. Anything that is not an ``EmbedServeError`` is INTERNAL with a
fixed message: its text may hold paths or tensor dumps, so it goes to the log with
its traceback, never to the client. The gateway's public gRPC API takes its codes
from ``GRPC_CODES`` too (gateway/grpc_api_errors.py).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

import grpc

from embedserve import errors

_C = grpc.StatusCode


@dataclass(frozen=True)
class ErrorRow:
    """One class's place on the link."""

    code: grpc.StatusCode
    # Names the class in a frame REPLY (its last header field): fixed here, never reused
    # for another class; 0 names none. Pinned by tests/test_link_errors.py.
    number: int
    # What the gateway raises for it: the class itself, or (``Cancelled``) another.
    gateway_view: Callable[[str, grpc.StatusCode], errors.EmbedServeError]


def _replica_error(message: str, code: grpc.StatusCode) -> errors.EmbedServeError:
    return errors.EmbedServeError(f"replica error ({code.name}): {message}")


def _model_not_found(message: str, code: grpc.StatusCode) -> errors.ModelNotFound:
    # ModelNotFound words its own message from a name; the replica's message is kept.
    error = errors.ModelNotFound("")
    error.message, error.args = message, (message,)
    return error


ERROR_TABLE: dict[type[errors.EmbedServeError], ErrorRow] = {
    errors.EmbedServeError: ErrorRow(_C.INTERNAL, 1, _replica_error),
    errors.InvalidInput: ErrorRow(_C.INVALID_ARGUMENT, 2, lambda m, c: errors.InvalidInput(m)),
    errors.InputTooLong: ErrorRow(_C.INVALID_ARGUMENT, 3, lambda m, c: errors.InputTooLong(m)),
    errors.ModelNotFound: ErrorRow(_C.NOT_FOUND, 4, _model_not_found),
    errors.Overloaded: ErrorRow(_C.RESOURCE_EXHAUSTED, 5,
                                lambda m, c: errors.Overloaded(f"replicas are overloaded: {m}")),
    errors.Unavailable: ErrorRow(_C.UNAVAILABLE, 6, lambda m, c: errors.Unavailable(
        f"no replica could serve the request: {m}")),
    errors.DeviceLost: ErrorRow(_C.UNAVAILABLE, 7, lambda m, c: errors.DeviceLost(
        f"no replica could serve the request: {m}")),
    errors.DeadlineExceeded: ErrorRow(_C.DEADLINE_EXCEEDED, 8,
                                      lambda m, c: errors.DeadlineExceeded(f"the request timed out ({m})")),
    # Cancelled means "the caller went away"; the gateway is the replica's caller and is
    # still there, so a replica that cancels (it is stopping) is one that is unavailable:
    # 503 and retried elsewhere, never the 499 of a client that left.
    errors.Cancelled: ErrorRow(_C.CANCELLED, 9, lambda m, c: errors.Unavailable(
        f"the replica cancelled the call: {m}")),
    errors.ModelLoadError: ErrorRow(_C.INTERNAL, 10, lambda m, c: errors.ModelLoadError(
        f"replica error: {m}")),
}
GRPC_CODES: dict[type[errors.EmbedServeError], grpc.StatusCode] = {
    cls: row.code for cls, row in ERROR_TABLE.items()}
# The trailing metadata key that names a failed call's class on gRPC.
ERROR_METADATA_KEY = "embedserve-error"
_CLASS_BY_NAME = {cls.__name__: cls for cls in ERROR_TABLE}
_CLASS_BY_NUMBER = {row.number: cls for cls, row in ERROR_TABLE.items()}

INTERNAL_MESSAGE = "internal error in the scheduler (details are in its log)"

# Codes that say "this replica failed", not "this request is bad": the chunk
# is worth another replica. RESOURCE_EXHAUSTED is retried too (another replica
# may have room). DEADLINE_EXCEEDED, INVALID_ARGUMENT and NOT_FOUND are final.
RETRYABLE_CODES = frozenset({_C.UNAVAILABLE, _C.UNKNOWN, _C.INTERNAL, _C.CANCELLED,
                             _C.RESOURCE_EXHAUSTED, _C.ABORTED})

# Codes after which the replica is taken out until its health watch says
# SERVING again (connection refused or reset, replica draining or killed).
REPLICA_DOWN_CODES = frozenset({_C.UNAVAILABLE, _C.UNKNOWN})


# -- the replica's side -------------------------------------------------------

def _row_class(error: BaseException) -> type[errors.EmbedServeError] | None:
    """The most specific class of ``error`` with a row; None for a foreign exception."""
    if isinstance(error, errors.EmbedServeError):
        for cls in type(error).__mro__:
            if cls in ERROR_TABLE:
                return cls
    return None


def grpc_status(error: BaseException) -> tuple[grpc.StatusCode, str]:
    """(code, client-safe message) for any exception."""
    cls = _row_class(error)
    if cls is None:
        return _C.INTERNAL, INTERNAL_MESSAGE
    assert isinstance(error, errors.EmbedServeError)
    return ERROR_TABLE[cls].code, error.message


def error_metadata(error: BaseException) -> tuple[tuple[str, str], ...]:
    """The trailing metadata that names ``error``'s class (empty for a foreign one)."""
    cls = _row_class(error)
    return () if cls is None else ((ERROR_METADATA_KEY, cls.__name__),)


def error_number(metadata: Iterable[tuple[str, str | bytes]] | None) -> int:
    """The class ``metadata`` names, as a frame REPLY's number (0: none)."""
    cls = _CLASS_BY_NAME.get(_named(metadata))
    return 0 if cls is None else ERROR_TABLE[cls].number


def metadata_of_number(number: int) -> tuple[tuple[str, str], ...]:
    """A frame REPLY's class number as gRPC's trailing metadata (empty: none, or unknown)."""
    cls = _CLASS_BY_NUMBER.get(number)
    return () if cls is None else ((ERROR_METADATA_KEY, cls.__name__),)


# -- the gateway's side ---------------------------------------------------------

def is_retryable(code: grpc.StatusCode) -> bool:
    return code in RETRYABLE_CODES


def from_replica_error(error: grpc.aio.AioRpcError | grpc.RpcError) -> errors.EmbedServeError:
    """The embedserve error a failed replica call (over gRPC or frames) stands for.

    ``error`` answers ``code()``, ``details()`` and ``trailing_metadata()``, as
    grpc.aio's ``AioRpcError`` and frame_client's ``ReplicaCallError`` both do."""
    return from_rpc_error(error.code(), error.details(), _named(error.trailing_metadata()))


def from_rpc_error(code: grpc.StatusCode, details: str | None,
                   error_name: str = "") -> errors.EmbedServeError:
    """``error_name``'s class when the replica named one whose code matches, else the
    class ``code`` stands for."""
    message = details or code.name.lower()
    cls = _CLASS_BY_NAME.get(error_name)
    if cls is not None and ERROR_TABLE[cls].code == code:
        return ERROR_TABLE[cls].gateway_view(message, code)
    if code == _C.UNAUTHENTICATED:
        # The gateway's replica token is missing or wrong: a deployment error,
        # the same on every replica, so not retried; the client sees 503.
        return errors.Unavailable("a replica refused the gateway's credentials "
                                  "(the gateway's --replica-token-file must match the replicas')")
    by_code = {_C.INVALID_ARGUMENT: errors.InvalidInput, _C.NOT_FOUND: errors.ModelNotFound,
               _C.RESOURCE_EXHAUSTED: errors.Overloaded, _C.UNAVAILABLE: errors.Unavailable,
               _C.DEADLINE_EXCEEDED: errors.DeadlineExceeded, _C.CANCELLED: errors.Cancelled}
    return ERROR_TABLE[by_code.get(code, errors.EmbedServeError)].gateway_view(message, code)


def _named(metadata: Iterable[tuple[str, str | bytes]] | None) -> str:
    for key, value in metadata or ():
        if key == ERROR_METADATA_KEY:
            return value if isinstance(value, str) else value.decode(errors="replace")
    return ""
