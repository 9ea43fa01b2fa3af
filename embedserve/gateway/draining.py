"""Admission for a clean shutdown: count the requests admitted, refuse new ones once draining.

Owns the gateway's answer to "stop": after ``Drain.begin()`` every new
request (readiness included) is answered 503 with OpenAI's error body,
``Retry-After`` and ``Connection: close``, while the requests admitted
before it run to their normal answer; ``wait_idle`` returns once the last of
them has been sent. ``/health`` and ``/metrics`` stay open throughout (the
process is alive and can be watched). The entry point (``cli.py``) decides
when to begin and how long to wait; this module never stops the server.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Iterator

from prometheus_client import CollectorRegistry, Counter, Gauge
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from embedserve.gateway.http_errors import error_body

# Answered whether or not the gateway is draining, and never counted.
ALWAYS_OPEN = frozenset({"/health", "/metrics"})
READY_PATH = "/ready"
DRAINING_MESSAGE = "the server is shutting down; retry the request"


class Drain:
    """Requests admitted and still running, and whether new ones are refused."""

    def __init__(self, registry: CollectorRegistry, retry_after_s: int) -> None:
        self.retry_after_s = retry_after_s
        self.draining = False
        self.in_flight = 0
        self._idle = asyncio.Event()
        self._idle.set()
        self.admitted = Counter("embedserve_gateway_requests_admitted",
                                "Requests admitted (probes and /metrics excluded)", registry=registry)
        self.in_flight_gauge = Gauge("embedserve_gateway_requests_in_flight",
                                     "Requests admitted and not yet answered", registry=registry)
        self.in_flight_gauge.set_function(lambda: self.in_flight)

    def begin(self) -> None:
        """From now on, refuse new requests; those admitted carry on."""
        self.draining = True

    async def wait_idle(self, timeout_s: float) -> bool:
        """Until every admitted request is answered; False if ``timeout_s`` ran out first."""
        try:
            await asyncio.wait_for(self._idle.wait(), timeout_s)
        except TimeoutError:
            return False
        return True

    @contextlib.contextmanager
    def admitted_request(self) -> Iterator[None]:
        """Count one admitted request while the block runs."""
        self.in_flight += 1
        self.admitted.inc()
        self._idle.clear()
        try:
            yield
        finally:
            self.in_flight -= 1
            if self.in_flight == 0:
                self._idle.set()


class DrainMiddleware:
    """ASGI middleware that admits requests through a ``Drain``."""

    def __init__(self, app: ASGIApp, drain: Drain) -> None:
        self.app = app
        self.drain = drain

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope.get("path", "")
        if scope["type"] != "http" or path in ALWAYS_OPEN:
            await self.app(scope, receive, send)
            return
        if self.drain.draining:
            await self._refuse(send)
            return
        if path == READY_PATH:
            await self.app(scope, receive, send)
            return
        with self.drain.admitted_request():
            await self.app(scope, receive, self._closing_once_draining(send))

    def _closing_once_draining(self, send: Send) -> Send:
        """``send`` that adds ``Connection: close`` to a response started while draining.

        Otherwise the client keeps the connection and may send its next request on it
        just as the server, its last admitted request answered, closes idle
        connections: that request is cut (the client sees the connection drop, not a
        503). With the header its next request opens a new connection instead.
        """
        async def send_closing(message: Message) -> None:
            if message["type"] == "http.response.start" and self.drain.draining:
                headers = [(k, v) for k, v in message.get("headers", []) if k.lower() != b"connection"]
                message = {**message, "headers": [*headers, (b"connection", b"close")]}
            await send(message)

        return send_closing

    async def _refuse(self, send: Send) -> None:
        body = json.dumps(error_body(503, DRAINING_MESSAGE, None, "draining")).encode()
        # Connection: close, so a client's next request opens a new connection
        # and meets a closed port, never a keep-alive connection cut mid-request.
        headers = [(b"content-type", b"application/json"),
                   (b"content-length", str(len(body)).encode()),
                   (b"retry-after", str(self.drain.retry_after_s).encode()),
                   (b"connection", b"close")]
        await send({"type": "http.response.start", "status": 503, "headers": headers})
        await send({"type": "http.response.body", "body": body})
