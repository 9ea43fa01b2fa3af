"""Errors in the shapes of the APIs whose clients parse them: TEI's and Cohere's.

The gateway answers every error in OpenAI's shape (``http_errors.py``, one
table of statuses). The routes that stand in for another server answer in
that server's shape instead, with the same statuses and messages, because
its client reads them:

- TEI (``POST /``, ``/similarity``): ``{"error": message, "error_type": kind}``;
  ``huggingface_hub`` puts ``error`` into the ``HfHubHTTPError`` it raises.
- Cohere (``/v2/embed``, ``/v2/rerank``): ``{"id": request_id, "message": message}``;
  the ``cohere`` SDK raises the status's error class (``BadRequestError``...) with
  that body.

Owns the reshaping only: an ``EmbedServeError`` raised by such a route's handler
(``tei_error``/``cohere_error``) and a request FastAPI could not validate (the
route classes ``TeiRoute``/``CohereRoute``: the message is the app's own
validation handler's). Refusals made before routing (API key, body size,
draining) keep OpenAI's shape; the declared error schemas say so.
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from typing import Any

import orjson
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from fastapi.routing import APIRoute
from pydantic import BaseModel
from starlette.requests import Request
from starlette.responses import Response

from embedserve.errors import EmbedServeError
from embedserve.gateway.http_errors import HTTP_STATUSES, embedserve_error_response
from embedserve.gateway.middleware import REQUEST_ID_KEY
from embedserve.gateway.schemas import ErrorDetail

# OpenAI-shaped error body -> this API's shape: (status, OpenAI's "error" object, request) -> body.
Reshape = Callable[[int, dict, Request], dict]


def _tei_error_type(status: int) -> str:
    """TEI's ``error_type`` for a status (TEI: 413 validation, 429 overloaded, 503 unhealthy)."""
    if status == 429:
        return "overloaded"
    if status == 503:
        return "unhealthy"
    if status >= 500:
        return "backend"
    return "empty" if status == 400 else "validation"


def tei_body(status: int, error: dict, request: Request) -> dict:
    return {"error": error.get("message", ""), "error_type": _tei_error_type(status)}


def cohere_body(status: int, error: dict, request: Request) -> dict:
    return {"id": request.scope.get(REQUEST_ID_KEY, ""), "message": error.get("message", "")}


def _reshaped(response: Response, reshape: Reshape, request: Request) -> Response:
    """An OpenAI-shaped error answer in another shape: same status and headers (Retry-After)."""
    error = orjson.loads(bytes(response.body))["error"]
    headers = {k: v for k, v in response.headers.items()
               if k.lower() not in ("content-length", "content-type")}
    return JSONResponse(reshape(response.status_code, error, request),
                        status_code=response.status_code, headers=headers)


def tei_error(exc: EmbedServeError, request: Request) -> Response:
    """``exc`` as TEI answers an error."""
    return _reshaped(embedserve_error_response(exc), tei_body, request)


def cohere_error(exc: EmbedServeError, request: Request) -> Response:
    """``exc`` as Cohere answers an error."""
    return _reshaped(embedserve_error_response(exc), cohere_body, request)


class _ReshapingRoute(APIRoute):
    """A route whose body-validation errors (422, malformed JSON's 400) take ``reshape``'s shape.

    FastAPI raises ``RequestValidationError`` inside the route's own handler, so it is
    caught here and answered by the app's handler for it, then reshaped. (The direct
    routes hand any body that fails validation to FastAPI, so both paths end here.)
    """

    reshape: Reshape

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()
        reshape = type(self).reshape

        async def reshaping_handler(request: Request) -> Response:
            try:
                return await handler(request)
            except RequestValidationError as exc:
                answer = request.app.exception_handlers[RequestValidationError]
                return _reshaped(await answer(request, exc), reshape, request)

        return reshaping_handler


class TeiRoute(_ReshapingRoute):
    reshape = staticmethod(tei_body)


class CohereRoute(_ReshapingRoute):
    reshape = staticmethod(cohere_body)


# -- the declared error bodies (OpenAPI) -------------------------------------

class TeiErrorResponse(BaseModel):
    """TEI's error shape; ``error`` is OpenAI's object where the gateway refused the
    request before routing (API key, body size, draining)."""

    error: str | ErrorDetail
    error_type: str | None = None


class CohereErrorResponse(BaseModel):
    """Cohere's error shape (``id``, ``message``); OpenAI's ``error`` object where the
    gateway refused the request before routing (API key, body size, draining)."""

    id: str | None = None
    message: str | None = None
    error: ErrorDetail | None = None


def error_responses(model: type[BaseModel]) -> dict[int | str, dict[str, Any]]:
    """Every error status the gateway declares, with ``model`` as its body."""
    return {status: {"model": model, "description": entry.description}
            for status, entry in HTTP_STATUSES.items() if entry.description is not None}
