"""The closed set of errors embedserve raises across tiers.

    EmbedServeError
     ├── InvalidInput        bad request content (empty, wrong ids, bad option)
     │    ├── InputTooLong   a sequence exceeds the model's or request's limit
     │    └── ModelNotFound  the request names a model this deployment does not serve
     ├── Overloaded          queue or in-flight budget full; retry later
     ├── Unavailable         draining, not ready, or no replica can serve
     ├── DeadlineExceeded    the caller's deadline passed before an answer
     ├── Cancelled           the caller went away
     └── ModelLoadError      a model directory or tokenizer file is unusable

Each transport maps these exactly once (HTTP status in the gateway, gRPC
status code in the scheduler); a test checks every class is mapped. Foreign
exceptions are translated into these only at the boundary that sees them.
"""

from __future__ import annotations


class EmbedServeError(Exception):
    """Base class; ``message`` is safe to show to a client."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class InvalidInput(EmbedServeError):
    """The request is malformed or asks for something unsupported."""

    def __init__(self, message: str, field: str | None = None) -> None:
        super().__init__(message)
        self.field = field


class InputTooLong(InvalidInput):
    """An input is longer than allowed and truncation is off."""

    def __init__(self, message: str, index: int | None = None, length: int | None = None,
                 limit: int | None = None, field: str | None = None) -> None:
        super().__init__(message, field)
        self.index = index
        self.length = length
        self.limit = limit


class ModelNotFound(InvalidInput):
    """The request names a model that is not served here."""

    def __init__(self, name: str) -> None:
        super().__init__(f"The model `{name}` does not exist or is not served here; "
                         "GET /v1/models lists the served names", field="model")
        self.name = name


class Overloaded(EmbedServeError):
    """Too much work is queued; the client should back off and retry."""

    def __init__(self, message: str, retry_after_s: float = 1.0) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class Unavailable(EmbedServeError):
    """The service cannot take work now (draining, warming up, no replica)."""


class DeviceLost(Unavailable):
    """The accelerator failed in a way this process cannot recover from (a sticky
    CUDA error); the replica stops serving and exits so that it is restarted."""


class DeadlineExceeded(EmbedServeError):
    """The caller's deadline passed before the work finished."""


class Cancelled(EmbedServeError):
    """The caller cancelled; nobody is waiting for the answer."""


class ModelLoadError(EmbedServeError):
    """A model or tokenizer file is missing, malformed or unsupported."""


def _subclasses(cls: type[EmbedServeError]) -> list[type[EmbedServeError]]:
    """``cls``'s subclasses, recursively, parents before children."""
    found: list[type[EmbedServeError]] = []
    for sub in cls.__subclasses__():
        found += [sub, *_subclasses(sub)]
    return found


# Derived from the tree, not typed out, so a class added above and left out of
# a transport's table fails that table's test. Every class lives in this module
# (tests/test_errors.py checks that none is defined elsewhere in embedserve), so
# the tree is complete once this module has run.
ALL_ERRORS: tuple[type[EmbedServeError], ...] = (EmbedServeError, *_subclasses(EmbedServeError))
