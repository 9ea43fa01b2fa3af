"""HTTP side of the error set: status codes, OpenAI's error body, handlers.

Owns the one mapping from ``embedserve.errors`` classes to HTTP statuses and
the exception handlers registered once on the app. Every error leaves the
gateway as OpenAI's shape::

    {"error": {"message": str, "type": str, "param": str | None, "code": str | None}}

Foreign exceptions (pydantic validation, Starlette HTTP errors) are
translated here; an unexpected exception is logged with its traceback by
``middleware.GatewayMiddleware`` and answered with a clean 500.
"""

from __future__ import annotations

import logging
import math
import re

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from embedserve import errors
from embedserve.gateway.schemas import ErrorResponse

log = logging.getLogger(__name__)

# status, OpenAI error type, code. Most specific class first: lookup walks the
# exception's MRO, so InputTooLong finds its own row before InvalidInput's.
STATUS_BY_ERROR: dict[type[errors.EmbedServeError], tuple[int, str, str]] = {
    errors.InputTooLong: (413, "invalid_request_error", "input_too_long"),
    # OpenAI's answer for a model it does not have.
    errors.ModelNotFound: (404, "invalid_request_error", "model_not_found"),
    errors.InvalidInput: (400, "invalid_request_error", "invalid_input"),
    errors.Overloaded: (429, "rate_limit_error", "overloaded"),
    errors.Unavailable: (503, "service_unavailable", "unavailable"),
    errors.DeadlineExceeded: (504, "timeout_error", "timeout"),
    # Nobody reads the answer; 499 is the de-facto "client closed request".
    errors.Cancelled: (499, "cancelled", "cancelled"),
    errors.ModelLoadError: (503, "service_unavailable", "model_unavailable"),
    errors.EmbedServeError: (500, "server_error", "internal_error"),
}

_TYPE_BY_STATUS = {
    400: "invalid_request_error", 401: "authentication_error", 404: "invalid_request_error",
    405: "invalid_request_error", 413: "invalid_request_error", 415: "invalid_request_error",
    422: "invalid_request_error", 429: "rate_limit_error", 500: "server_error",
    503: "service_unavailable", 504: "timeout_error",
}


# Declared on every route so the OpenAPI document tells clients (and the schema
# fuzzer) every status the gateway can answer with, all in OpenAI's error shape.
ERROR_RESPONSES: dict[int | str, dict] = {
    status: {"model": ErrorResponse, "description": description}
    for status, description in (
        (400, "Bad input (the field is named in error.param)"),
        (401, "Missing or wrong API key"),
        (404, "The requested model is not served here (code model_not_found)"),
        (413, "Body too large, too many inputs, or an input too long with truncation off"),
        (422, "Wrong type or shape of a field"),
        (429, "In-flight token budget full; retry after Retry-After seconds"),
        (500, "Unexpected error (no traceback is returned)"),
        (503, "No replica ready"),
        (504, "Timed out"),
    )
}


def error_body(message: str, type_: str, param: str | None = None, code: str | None = None) -> dict:
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}


def error_response(status: int, message: str, param: str | None = None, code: str | None = None,
                   headers: dict[str, str] | None = None) -> JSONResponse:
    type_ = _TYPE_BY_STATUS.get(status, "server_error" if status >= 500 else "invalid_request_error")
    return JSONResponse(error_body(message, type_, param, code), status_code=status, headers=headers)


def status_for(exc: errors.EmbedServeError) -> tuple[int, str, str]:
    for cls in type(exc).__mro__:
        if cls in STATUS_BY_ERROR:
            return STATUS_BY_ERROR[cls]
    raise TypeError(f"{type(exc).__name__} is not an embedserve error")


def embedserve_error_response(exc: errors.EmbedServeError) -> JSONResponse:
    status, type_, code = status_for(exc)
    param = getattr(exc, "field", None)
    headers = None
    if isinstance(exc, errors.Overloaded):
        headers = {"Retry-After": str(max(1, math.ceil(exc.retry_after_s)))}
    if status >= 500 and type(exc) is errors.EmbedServeError:
        log.error("request failed: %s", exc.message)
    return JSONResponse(error_body(exc.message, type_, param, code), status_code=status, headers=headers)


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


def install_error_handlers(app: FastAPI) -> None:
    """Register the handlers once for the whole app (not per route).

    Unexpected exceptions are caught by ``GatewayMiddleware`` instead, inside
    the layer that adds x-request-id and Server-Timing to every response.
    """
    app.add_exception_handler(errors.EmbedServeError, _on_embedserve_error)
    app.add_exception_handler(RequestValidationError, _on_validation_error)
    app.add_exception_handler(StarletteHTTPException, _on_http_error)
