"""The JSON POST routes' common case, without FastAPI's per-request machinery.

FastAPI spends a few hundred microseconds of a short query's gateway time
around the handler: route matching through the included routers, an exit
stack, dependency solving, content-type sniffing, and two more wrappers on
every ``send``. For a route whose handler is ``(body: Model, request:
Request)``, this layer does the part that matters itself: a well-formed
``application/json`` body is validated against the same pydantic model (in
Python mode, as FastAPI does) and the route's own handler is awaited here,
its ``EmbedServeError`` answered by the same function the app's exception
handler uses.

Anything else goes on to FastAPI untouched, the body replayed: another
path or method, another content type, a body that is not JSON or fails
validation. So every error answer (422 shapes, malformed JSON, 415s) is
still FastAPI's and the error handlers', and the OpenAPI document is the
app's own. Sits inside the drain and gateway middlewares, so request ids,
Server-Timing, metrics and shutdown admission are the same on both paths.
"""

from __future__ import annotations

import inspect
import typing
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import orjson
from fastapi.routing import APIRoute
from pydantic import BaseModel, ValidationError
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute
from starlette.types import ASGIApp, Receive, Scope, Send

from embedserve.errors import EmbedServeError
from embedserve.gateway.http_errors import embedserve_error_response
from embedserve.gateway.middleware import read_body, replay_body

Handler = Callable[[BaseModel, Request], Awaitable[Response]]


@dataclass(frozen=True)
class DirectRoute:
    route: APIRoute          # set as scope["route"], as FastAPI's router would (metrics label it)
    body: type[BaseModel]
    handler: Handler


def direct_routes(routes: typing.Iterable[BaseRoute]) -> dict[str, DirectRoute]:
    """path -> DirectRoute for each POST route whose handler takes ``(body: Model, request: Request)``."""
    table: dict[str, DirectRoute] = {}
    for route in routes:
        if not isinstance(route, APIRoute) or route.methods != {"POST"}:
            continue
        body = _body_model(route.endpoint)
        if body is not None and "{" not in route.path:
            table[route.path] = DirectRoute(route, body, route.endpoint)
    return table


def _body_model(endpoint: Callable) -> type[BaseModel] | None:
    """The pydantic body model of ``endpoint(body: Model, request: Request)``, else None."""
    hints = typing.get_type_hints(endpoint)
    params = list(inspect.signature(endpoint).parameters)
    if len(params) != 2 or hints.get(params[1]) is not Request:
        return None
    body = hints.get(params[0])
    return body if isinstance(body, type) and issubclass(body, BaseModel) else None


def is_json(content_type: bytes | None) -> bool:
    """``application/json``, any parameters: the type every JSON client sends."""
    if content_type is None:
        return False
    return content_type.split(b";", 1)[0].strip().lower() == b"application/json"


class DirectRoutes:
    """ASGI layer that serves ``routes``' well-formed requests itself, the rest through ``app``."""

    def __init__(self, app: ASGIApp, routes: dict[str, DirectRoute]) -> None:
        self.app = app
        self.routes = routes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        direct = self.routes.get(scope["path"]) if scope["type"] == "http" else None
        if direct is None or scope["method"] != "POST" or not is_json(_header(scope, b"content-type")):
            await self.app(scope, receive, send)
            return
        raw = await read_body(receive)  # its size was bounded by the gateway middleware
        if raw is None:
            return   # the client left mid-body: nobody to answer
        try:
            body = direct.body.model_validate(orjson.loads(raw))
        except (orjson.JSONDecodeError, ValidationError):
            # FastAPI parses again and answers with its own shapes (json.loads's
            # messages, "body"-rooted locations), through the error handlers.
            await self.app(scope, replay_body(raw, receive), send)
            return
        scope["route"] = direct.route
        request = Request(scope, receive)
        try:
            response = await direct.handler(body, request)
        except EmbedServeError as exc:
            response = embedserve_error_response(exc)
        await response(scope, receive, send)


def _header(scope: Scope, name: bytes) -> bytes | None:
    """The first value of header ``name`` (ASGI servers lowercase header names)."""
    for key, value in scope["headers"]:
        if key == name:
            return value
    return None
