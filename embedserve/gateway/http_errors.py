"""HTTP side of the error set: status codes, OpenAI's error body, handlers.

Owns the one mapping from ``embedserve.errors`` classes to HTTP statuses and
the exception handlers registered once on the app. Every error leaves the
gateway as OpenAI's shape::

    {"error": {"message": str, "type": str, "param": str | None, "code": str | None}}

Foreign exceptions (pydantic validation, Starlette HTTP errors) are
translated here; an unexpected exception is answered with a clean 500
(``UNEXPECTED``) and logged with its traceback by ``middleware.GatewayMiddleware``.
"""

from __future__ import annotations

import logging
import math
import re
from dataclasses import dataclass

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from embedserve import errors
from embedserve.gateway.schemas import ErrorResponse

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class HttpStatus:
    """What the gateway says with one HTTP status."""

    type: str                   # OpenAI's error.type
    description: str | None     # in every route's OpenAPI answers; None: not a route's answer


# The one table of HTTP statuses the gateway answers errors with. Every error
# body, from a handler, the middleware or a route, takes its type from here.
HTTP_STATUSES: dict[int, HttpStatus] = {
    400: HttpStatus("invalid_request_error", "Bad input (the field is named in error.param)"),
    401: HttpStatus("authentication_error", "Missing or wrong API key"),
    404: HttpStatus("invalid_request_error",
                    "The requested model is not served here (code model_not_found)"),
    405: HttpStatus("invalid_request_error", None),
    413: HttpStatus("invalid_request_error",
                    "Body too large, too many inputs, or an input too long with truncation off"),
    415: HttpStatus("invalid_request_error", None),
    422: HttpStatus("invalid_request_error", "Wrong type or shape of a field"),
    429: HttpStatus("rate_limit_error", "In-flight token budget full; retry after Retry-After seconds"),
    # Nobody reads the answer; 499 is the de-facto "client closed request".
    499: HttpStatus("cancelled", None),
    500: HttpStatus("server_error", "Unexpected error (no traceback is returned)"),
    503: HttpStatus("service_unavailable", "No replica ready"),
    504: HttpStatus("timeout_error", "Timed out"),
}

# The error tree's HTTP mapping: status and error.code. Most specific class
# first: lookup walks the exception's MRO, so InputTooLong finds its own row
# before InvalidInput's.
STATUS_BY_ERROR: dict[type[errors.EmbedServeError], tuple[int, str]] = {
    errors.InputTooLong: (413, "input_too_long"),
    errors.ModelNotFound: (404, "model_not_found"),  # OpenAI's answer for a model it does not have
    errors.InvalidInput: (400, "invalid_input"),
    errors.Overloaded: (429, "overloaded"),
    errors.Unavailable: (503, "unavailable"),
    errors.DeviceLost: (503, "unavailable"),
    errors.DeadlineExceeded: (504, "timeout"),
    errors.Cancelled: (499, "cancelled"),
    errors.ModelLoadError: (503, "model_unavailable"),
    errors.EmbedServeError: (500, "internal_error"),
}

# Declared on every route so the OpenAPI document tells clients (and the schema
# fuzzer) every status the gateway can answer with, all in OpenAI's error shape.
ERROR_RESPONSES: dict[int | str, dict] = {
    status: {"model": ErrorResponse, "description": entry.description}
    for status, entry in HTTP_STATUSES.items() if entry.description is not None
}


# status, message and error.code of the answer to an unexpected exception (no traceback)
UNEXPECTED = (500, "internal server error", "internal_error")


def error_body(status: int, message: str, param: str | None = None, code: str | None = None) -> dict:
    """OpenAI's error shape, its type read from ``HTTP_STATUSES``."""
    entry = HTTP_STATUSES.get(status)
    type_ = entry.type if entry else "server_error" if status >= 500 else "invalid_request_error"
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}


def error_response(status: int, message: str, param: str | None = None, code: str | None = None,
                   headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse(error_body(status, message, param, code), status_code=status, headers=headers)


UNAVAILABLE_RETRY_AFTER_S = 1


def status_for(exc: errors.EmbedServeError) -> tuple[int, str]:
    """(HTTP status, error.code) of ``exc``, through its class hierarchy."""
    for cls in type(exc).__mro__:
        if cls in STATUS_BY_ERROR:
            return STATUS_BY_ERROR[cls]
    raise TypeError(f"{type(exc).__name__} is not an embedserve error")


def embedserve_error_response(exc: errors.EmbedServeError) -> JSONResponse:
    status, code = status_for(exc)
    headers = None
    if isinstance(exc, errors.Overloaded):
        headers = {"Retry-After": str(max(1, math.ceil(exc.retry_after_s)))}
    elif isinstance(exc, errors.Unavailable):
        # No replica ready (all restarting, say): worth a retry soon, as a draining 503 is.
        headers = {"Retry-After": str(UNAVAILABLE_RETRY_AFTER_S)}
    if status >= 500 and type(exc) is errors.EmbedServeError:
        log.error("request failed: %s", exc.message)
    return error_response(status, exc.message, getattr(exc, "field", None), code, headers)


def _validation_param(loc: tuple) -> str:
    """``("body", "input", "list[str]", 3)`` -> ``"input[3]"``.

    Drops the leading "body" and the names pydantic gives union members
    ("str", "list[int]", ...), which say nothing to a client.
    """
    text = ""
    for part in loc:
        if isinstance(part, int):
            text += f"[{part}]"
        elif part != "body" and not _UNION_TAG.match(part):
            text += f".{part}" if text else part
    return text or "body"


_UNION_TAG = re.compile(r"^(str|int|bool|float|list\[.*\]|dict\[.*\]|function-\w+\[.*\]|"
                        r"constrained-\w+|[A-Z]\w*)$")


async def _on_embedserve_error(request: Request, exc: errors.EmbedServeError) -> JSONResponse:
    return embedserve_error_response(exc)


async def _on_validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
    details = exc.errors()
    first = details[0] if details else {"loc": ("body",), "msg": "invalid request", "type": ""}
    if first.get("type") == "json_invalid":
        return error_response(400, f"malformed JSON: {first.get('msg')}", "body", "invalid_json")
    params = [_validation_param(tuple(d.get("loc", ()))) for d in details]
    param = params[0]
    if len(details) > 1 and len({p.split("[")[0] for p in params}) == 1:
        # Every alternative of a union failed: name the field and its accepted forms.
        field = param.split("[")[0]
        message = f"{field} has the wrong type or shape ({first.get('msg')}, and " \
                  f"{len(details) - 1} other alternatives failed)"
        return error_response(422, message, field, "invalid_type")
    return error_response(422, f"{param}: {first.get('msg')}", param, "invalid_value")


async def _on_http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
    return error_response(exc.status_code, str(exc.detail), None, None,
                          headers=getattr(exc, "headers", None))


async def _on_unexpected(request: Request, exc: Exception) -> JSONResponse:
    status, message, code = UNEXPECTED
    return error_response(status, message, None, code)


def install_error_handlers(app: FastAPI) -> None:
    """Register the handlers once for the whole app (not per route).

    An unexpected exception in a FastAPI route is answered by Starlette's error
    middleware with ``_on_unexpected``'s 500 and raised on to ``GatewayMiddleware``,
    which logs it; one outside FastAPI's stack (the direct routes) is answered and
    logged there alone.
    """
    app.add_exception_handler(errors.EmbedServeError, _on_embedserve_error)  # type: ignore[arg-type]  # its class
    app.add_exception_handler(RequestValidationError, _on_validation_error)  # type: ignore[arg-type]  # its class
    app.add_exception_handler(StarletteHTTPException, _on_http_error)  # type: ignore[arg-type]  # its class
    app.add_exception_handler(Exception, _on_unexpected)
