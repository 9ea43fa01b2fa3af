"""ASGI middleware: request ids, Server-Timing, body size limit, API keys.

Owns what every response carries (``x-request-id``, ``Server-Timing``) and
the checks that run before a route sees the request (body size, bearer
key; a request bearing one of the batch keys is marked to run in the batch
class, ``priority.py``). Pure ASGI rather than ``BaseHTTPMiddleware`` so the
route still sees the client's disconnect and no extra task sits on each request.

Routes record phase durations in ``scope["embedserve.timing"]`` (a dict of
name -> seconds); ``total`` is added here, and ``since_start`` measures a
phase that began when the request did (``parse``: up to the route handler).
With tracing on (docs/tracing.md), the request's span (``embedserve.otel.RequestTrace``,
continuing the client's ``traceparent``) is begun and ended here and kept in
``scope["embedserve.trace"]``, where the phases add theirs; off, that key is never set.
"""

from __future__ import annotations

import hmac
import json
import logging
import time
import uuid
from typing import TYPE_CHECKING

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from embedserve.gateway.http_errors import UNEXPECTED, error_body
from embedserve.gateway.metrics import GatewayMetrics
from embedserve.gateway.priority import FORCED_KEY, PRIORITY_KEY
from embedserve.link.wire import BATCH

if TYPE_CHECKING:
    from embedserve.otel import Tracer

log = logging.getLogger(__name__)

TIMING_KEY = "embedserve.timing"
REQUEST_ID_KEY = "embedserve.request_id"
STARTED_KEY = "embedserve.started"   # time.perf_counter() when the middleware saw the request
TRACE_KEY = "embedserve.trace"       # the request's embedserve.otel.RequestTrace, when traced
# Probes and scrapes make no trace: a kubelet's every-few-seconds checks would bury the requests.
UNTRACED_PATHS = frozenset({"/health", "/ready", "/metrics"})
# Probes and docs stay open when an API key is set.
OPEN_PATHS = frozenset({"/health", "/ready", "/metrics", "/docs", "/redoc", "/openapi.json",
                        "/docs/oauth2-redirect"})
# The docs pages' scripts and styles, served from the fastapi-offline package.
DOCS_ASSETS_PREFIX = "/static-offline-docs/"


class GatewayMiddleware:
    def __init__(self, app: ASGIApp, metrics: GatewayMetrics, max_body_bytes: int,
                 api_key: str | None, batch_api_keys: tuple[str, ...] = (),
                 tracer: Tracer | None = None) -> None:
        self.app = app
        self.tracer = tracer
        self.metrics = metrics
        self.max_body_bytes = max_body_bytes
        self.api_key = api_key
        self.batch_api_keys = tuple(key.encode() for key in batch_api_keys)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        scope[STARTED_KEY] = started
        headers = dict(scope.get("headers") or [])
        request_id = _clean_request_id(headers.get(b"x-request-id")) or uuid.uuid4().hex
        scope[REQUEST_ID_KEY] = request_id
        trace = None
        if self.tracer is not None and scope["path"] not in UNTRACED_PATHS:
            trace = scope[TRACE_KEY] = self.tracer.request(
                scope["method"], scope["path"], _header(headers, b"traceparent"),
                _header(headers, b"tracestate"),
                {"http.request.method": scope["method"], "url.path": scope["path"],
                 "embedserve.request_id": request_id})
        timing: dict[str, float] = {}
        scope[TIMING_KEY] = timing
        status_seen = [500]
        started_response = [False]

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                started_response[0] = True
                status_seen[0] = message["status"]
                timing["total"] = time.perf_counter() - started
                extra = [(b"x-request-id", request_id.encode()),
                         (b"server-timing", server_timing(timing).encode())]
                message = {**message, "headers": list(message.get("headers", [])) + extra}
            await send(message)

        try:
            refusal = self._refuse(scope, headers)
            if refusal is not None:
                await _send_error(send_with_headers, *refusal)
                return
            declared = headers.get(b"content-length")
            if declared is None and scope["method"] in ("POST", "PUT", "PATCH"):
                # A chunked body: read it here, within the limit, then replay it.
                body = await read_body(receive, self.max_body_bytes)
                if body is None:
                    await _send_error(send_with_headers, *self._too_large())
                    return
                receive = replay_body(body, receive)
            await self.app(scope, receive, send_with_headers)
        except Exception:
            # The one place an unexpected error ends: logged with its traceback,
            # answered with a clean 500 that carries none (unless FastAPI's error
            # middleware, inside, already sent that answer and raised it on).
            log.exception("unhandled error on %s %s", scope.get("method"), scope.get("path"))
            if not started_response[0]:
                await _send_error(send_with_headers, *UNEXPECTED)
        finally:
            seconds = time.perf_counter() - started
            self.metrics.count_request(_route_label(scope), status_seen[0], seconds)
            if PRIORITY_KEY in scope:   # a request that reached a model route
                self.metrics.count_class_request(scope[PRIORITY_KEY], seconds)
            if trace is not None:
                route = scope.get("route")
                trace.end(status_seen[0], getattr(route, "path", None))

    def _refuse(self, scope: Scope, headers: dict[bytes, bytes]) -> tuple[int, str, str | None] | None:
        """(status, message, error.code) of a request refused before routing, or None."""
        if ((self.api_key is not None or self.batch_api_keys) and scope["path"] not in OPEN_PATHS
                and not scope["path"].startswith(DOCS_ASSETS_PREFIX)):
            given = headers.get(b"authorization", b"").decode("latin-1")
            scheme, _, token = given.partition(" ")
            bearer = token.strip().encode() if scheme.lower() == "bearer" else None
            if bearer is not None and any(hmac.compare_digest(bearer, key)
                                          for key in self.batch_api_keys):
                scope[FORCED_KEY] = BATCH
            elif self.api_key is not None and (
                    bearer is None or not hmac.compare_digest(bearer, self.api_key.encode())):
                return (401, "missing or wrong API key (send 'Authorization: Bearer <key>')",
                        "invalid_api_key")
        declared = headers.get(b"content-length")
        if declared is not None:
            try:
                too_big = int(declared) > self.max_body_bytes
            except ValueError:
                return 400, "malformed Content-Length", None
            if too_big:
                return self._too_large()
        return None

    def _too_large(self) -> tuple[int, str, str]:
        return (413, f"request body larger than {self.max_body_bytes} bytes; send fewer inputs "
                     "per request, or start the server with a larger --max-body-bytes",
                "body_too_large")


def since_start(scope: Scope, phase: str) -> None:
    """Record, as ``phase``, the time from the request's arrival here until now."""
    started = scope.get(STARTED_KEY)
    if started is not None:
        scope.setdefault(TIMING_KEY, {})[phase] = time.perf_counter() - started
    trace = scope.get(TRACE_KEY)
    if trace is not None:
        trace.phase(phase, trace.start_ns)


def server_timing(timing: dict[str, float]) -> str:
    """``{"tokenize": 0.0012, ...}`` -> ``tokenize;dur=1.200, ...`` (milliseconds)."""
    return ", ".join(f"{name};dur={seconds * 1e3:.3f}" for name, seconds in timing.items())


def _header(headers: dict[bytes, bytes], name: bytes) -> str | None:
    value = headers.get(name)
    return None if value is None else value.decode("latin-1")


def _clean_request_id(raw: bytes | None) -> str | None:
    # Echo a client's id only when it is short and printable (it goes into logs).
    if raw and len(raw) <= 128 and all(33 <= b < 127 for b in raw):
        return raw.decode("ascii")
    return None


def _route_label(scope: Scope) -> str:
    # The matched route's template keeps label cardinality bounded.
    route = scope.get("route")
    return getattr(route, "path", "unmatched")


async def _send_error(send: Send, status: int, message: str, code: str | None) -> None:
    # Below the app, so no JSONResponse: the same body, sent as raw ASGI messages.
    body = json.dumps(error_body(status, message, None, code)).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    if status == 401:
        headers.append((b"www-authenticate", b"Bearer"))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


async def read_body(receive: Receive, limit: int | None = None) -> bytes | None:
    """The whole request body; None if the client left first or it grew past ``limit`` bytes."""
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] != "http.request":
            return None
        chunk = message.get("body", b"")
        size += len(chunk)
        if limit is not None and size > limit:
            return None
        chunks.append(chunk)
        if not message.get("more_body", False):
            return chunks[0] if len(chunks) == 1 else b"".join(chunks)


def replay_body(body: bytes, receive: Receive) -> Receive:
    """``receive`` that first hands out ``body`` (already read) as the whole request body."""
    sent = False

    async def replay() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay
