"""The gateway's in-flight token budget (admission control for 429).

Owns a counter and nothing else: a request takes its token count before it
is dispatched and gives it back when it is answered. It never waits: a
request that does not fit is refused at once with ``Overloaded`` so that
memory stays bounded and the client backs off (429 + Retry-After).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from embedserve.errors import InputTooLong, Overloaded


class TokenBudget:
    def __init__(self, capacity: int, retry_after_s: float = 1.0) -> None:
        self.capacity = capacity
        self.retry_after_s = retry_after_s
        self.in_use = 0

    @contextmanager
    def hold(self, tokens: int) -> Iterator[None]:
        """Hold ``tokens`` for the body of the ``with``; raise if they do not fit.

        Single-threaded use from the event loop, so no lock is needed.
        """
        if tokens > self.capacity:
            raise InputTooLong(f"the request has {tokens} tokens, more than the gateway's in-flight "
                               f"budget of {self.capacity}; send fewer inputs per request, or start "
                               "the server with a larger --max-inflight-tokens",
                               length=tokens, limit=self.capacity, field="input")
        if self.in_use + tokens > self.capacity:
            raise Overloaded(f"the gateway is busy ({self.in_use} of {self.capacity} tokens in flight); "
                             "retry later", retry_after_s=self.retry_after_s)
        self.in_use += tokens
        try:
            yield
        finally:
            self.in_use -= tokens
