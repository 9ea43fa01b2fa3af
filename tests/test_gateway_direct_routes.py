"""The JSON routes' direct path (``gateway/direct_routes.py``) against FastAPI's own.

Unit tests put ``DirectRoutes`` in front of an inner app that records what
reaches it, so which path served a request is observed, not assumed. The
end-to-end tests send each request twice to a real gateway and replica:
once as ``application/json`` (the direct path) and once as
``application/vnd.api+json``, a JSON type FastAPI parses but the direct path
leaves to it. Status, body and metrics label must not tell them apart.
"""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest
from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, StrictStr

from embedserve.errors import InvalidInput
from embedserve.gateway.direct_routes import DirectRoutes, direct_routes, is_json
from embedserve.gateway.routes import embed, ops, rerank, tokenize
from gateway_harness import gateway_in_front_of, metric_value

FASTAPI_JSON = "application/vnd.api+json"


class Echo(BaseModel):
    text: StrictStr
    times: int = 1


router = APIRouter()


@router.post("/echo")
async def echo(body: Echo, request: Request) -> Response:
    if body.times < 0:
        raise InvalidInput("times must be >= 0", field="times")
    return JSONResponse({"echo": body.text * body.times, "route": request.scope["route"].path})


@router.post("/with-query")
async def with_query(body: Echo, request: Request, limit: int = 3) -> Response:
    return JSONResponse({})


@router.get("/status")
async def status(request: Request) -> Response:
    return JSONResponse({})


class Inner:
    """The app behind the direct routes: records each request's path and body, answers 299."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, bytes]] = []

    async def __call__(self, scope, receive, send) -> None:
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body", False):
                break
        self.seen.append((scope["path"], body))
        await send({"type": "http.response.start", "status": 299, "headers": []})
        await send({"type": "http.response.body", "body": b""})


def post(app, path: str, body: bytes, content_type: str | None = "application/json",
         method: str = "POST") -> httpx.Response:
    async def send() -> httpx.Response:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                     base_url="http://test") as client:
            headers = {"content-type": content_type} if content_type else {}
            return await client.request(method, path, content=body, headers=headers)
    return asyncio.run(send())


def test_only_post_routes_taking_a_body_model_and_the_request_are_direct():
    assert set(direct_routes(router.routes)) == {"/echo"}
    table = direct_routes(r for m in (embed, rerank, tokenize, ops) for r in m.router.routes)
    assert set(table) == {"/v1/embeddings", "/embed", "/rerank", "/v1/rerank", "/tokenize"}
    assert table["/v1/embeddings"].body.__name__ == "EmbeddingsRequest"


def test_is_json_takes_application_json_with_any_parameters_only():
    assert is_json(b"application/json") and is_json(b"Application/JSON; charset=utf-8")
    for other in (None, b"", b"text/plain", b"application/vnd.api+json", b"application/jsonx"):
        assert not is_json(other)


def test_a_well_formed_request_is_served_without_the_inner_app():
    inner = Inner()
    app = DirectRoutes(inner, direct_routes(router.routes))
    for content_type in ("application/json", "application/json; charset=utf-8"):
        reply = post(app, "/echo", b'{"text": "ab", "times": 2}', content_type)
        assert reply.status_code == 200
        assert reply.json() == {"echo": "abab", "route": "/echo"}
    assert inner.seen == []


@pytest.mark.parametrize("body, content_type, method, path", [
    (b'{"text": "ab"', "application/json", "POST", "/echo"),              # malformed JSON
    (b'{"text": 3}', "application/json", "POST", "/echo"),                # fails validation
    (b'{"text": "\\ud800"}', "application/json", "POST", "/echo"),       # orjson refuses; json.loads takes it
    (b'{"text": "ab"}', "text/plain", "POST", "/echo"),                   # another content type
    (b'{"text": "ab"}', None, "POST", "/echo"),                           # none at all
    (b'{"text": "ab"}', FASTAPI_JSON, "POST", "/echo"),
    (b'{"text": "ab"}', "application/json", "PUT", "/echo"),              # another method
    (b'{"text": "ab"}', "application/json", "POST", "/with-query"),       # not (body, request)
    (b'{"text": "ab"}', "application/json", "POST", "/elsewhere"),
])
def test_anything_else_reaches_the_inner_app_with_its_body_whole(body, content_type, method, path):
    inner = Inner()
    app = DirectRoutes(inner, direct_routes(router.routes))
    reply = post(app, path, body, content_type, method)
    assert reply.status_code == 299
    assert inner.seen == [(path, body)]


def test_a_body_sent_in_parts_is_joined():
    inner = Inner()
    app = DirectRoutes(inner, direct_routes(router.routes))

    async def parts():
        for part in (b'{"text": ', b'"a', b'b"}'):
            yield part
    reply = asyncio.run(_post_stream(app, parts()))
    assert reply.status_code == 200 and reply.json()["echo"] == "ab"
    assert inner.seen == []


async def _post_stream(app, stream) -> httpx.Response:
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test") as client:
        return await client.post("/echo", content=stream, headers={"content-type": "application/json"})


def test_the_handlers_embedserve_errors_are_answered_in_openais_shape():
    app = DirectRoutes(Inner(), direct_routes(router.routes))
    reply = post(app, "/echo", b'{"text": "ab", "times": -1}')
    assert reply.status_code == 400
    assert reply.json() == {"error": {"message": "times must be >= 0", "type": "invalid_request_error",
                                      "param": "times", "code": "invalid_input"}}


# --- a real gateway: the direct path and FastAPI's give the same answers ---------

@pytest.fixture(scope="module")
def embedder(tiny_bert_replica):
    with gateway_in_front_of(tiny_bert_replica, max_inputs=4) as server:
        yield server


@pytest.fixture(scope="module")
def reranker(tiny_reranker_replica):
    with gateway_in_front_of(tiny_reranker_replica) as server:
        yield server


EMBEDDER_REQUESTS = [
    ("/v1/embeddings", {"input": "a short query"}),
    ("/v1/embeddings", {"input": ["one", "two texts"], "encoding_format": "base64", "dimensions": 16}),
    ("/v1/embeddings", {"input": [[5, 6, 7]], "embedding_types": ["float", "int8", "binary"]}),
    ("/embed", {"inputs": ["tei shape", "and another"], "normalize": False}),
    ("/tokenize", {"inputs": "count me"}),
    # Errors the handlers raise, after validation passed:
    ("/v1/embeddings", {"input": []}),                                    # 400
    ("/v1/embeddings", {"input": "x", "model": "not-served"}),            # 404
    ("/v1/embeddings", {"input": ["a", "b", "c", "d", "e"]}),             # 413
    ("/v1/embeddings", {"input": "x", "dimensions": 100000}),             # 400
    ("/rerank", {"query": "q", "texts": ["a"]}),                          # 400: not a reranker
    # Errors from validation, which the direct path leaves to FastAPI:
    ("/v1/embeddings", {"input": 3}),
    ("/embed", {"inputs": "x", "normalize": "yes please"}),
]


def both_paths(server, path: str, payload: dict) -> tuple[httpx.Response, httpx.Response]:
    """The same body sent once to the direct path and once past it, to FastAPI."""
    body = json.dumps(payload).encode()
    with server.client() as http:
        return (http.post(path, content=body, headers={"content-type": "application/json"}),
                http.post(path, content=body, headers={"content-type": FASTAPI_JSON}))


@pytest.mark.parametrize("path, payload", EMBEDDER_REQUESTS)
def test_the_direct_path_answers_as_fastapi_does(embedder, path, payload):
    direct, fastapi = both_paths(embedder, path, payload)
    assert direct.status_code == fastapi.status_code
    assert direct.content == fastapi.content
    assert direct.headers["content-type"] == fastapi.headers["content-type"]
    for reply in (direct, fastapi):
        assert len(reply.headers["x-request-id"]) == 32
        assert "total;dur=" in reply.headers["server-timing"]


@pytest.mark.parametrize("path, payload", [
    ("/rerank", {"query": "which?", "texts": ["this one", "or that one"], "return_text": True}),
    ("/v1/rerank", {"query": "which?", "documents": ["this one", {"text": "that one"}], "top_n": 1}),
    ("/v1/embeddings", {"input": "x"}),                                   # 400: not an embedder
])
def test_the_direct_path_reranks_as_fastapi_does(reranker, path, payload):
    direct, fastapi = both_paths(reranker, path, payload)
    assert direct.status_code == fastapi.status_code
    assert direct.content == fastapi.content


def test_direct_requests_are_counted_under_their_route(embedder):
    with embedder.client() as http:
        before = metric_value(http.get("/metrics").text, "embedserve_gateway_requests_total",
                              route="/v1/embeddings", status="200")
        for _ in range(3):
            assert http.post("/v1/embeddings", json={"input": "counted"}).status_code == 200
        after = metric_value(http.get("/metrics").text, "embedserve_gateway_requests_total",
                             route="/v1/embeddings", status="200")
    assert after - before == 3


# TEI's / and /similarity, Cohere's v2 (gateway/routes/tei.py, cohere.py): their answers and
# their own error shapes are the same on both paths (Cohere's carry the request id, sent here).
COMPATIBLE_API_REQUESTS = [
    ("embedder", "/", {"inputs": ["tei shape", "and another"], "prompt_name": "query"}),
    ("embedder", "/", {"inputs": {"source_sentence": "a", "sentences": ["b", "c"]}, "parameters": {}}),
    ("embedder", "/similarity", {"inputs": {"source_sentence": "a", "sentences": ["b"]}}),
    ("embedder", "/v2/embed", {"texts": ["x"], "input_type": "search_query",
                               "embedding_types": ["float", "int8", "base64"]}),
    ("reranker", "/v2/rerank", {"query": "which?", "documents": ["this one", "or that"], "top_n": 1}),
    ("reranker", "/", {"query": "which?", "texts": ["this one", "or that"]}),
    # Errors the handlers raise (TEI's and Cohere's shapes):
    ("embedder", "/", {"inputs": ""}),                                    # 400
    ("embedder", "/v2/embed", {"texts": ["x"], "input_type": "image"}),   # 400
    ("reranker", "/v2/embed", {"texts": ["x"]}),                          # 400: not an embedder
    # Errors from validation, left to FastAPI by the direct path, reshaped by the route class:
    ("embedder", "/", {"inputs": 5}),
    ("embedder", "/v2/embed", {"texts": "not a list"}),
]


@pytest.mark.parametrize("stack, path, payload", COMPATIBLE_API_REQUESTS)
def test_the_direct_path_answers_the_compatible_apis_as_fastapi_does(request, stack, path, payload):
    server = request.getfixturevalue(stack)
    body = json.dumps(payload).encode()
    with server.client() as http:
        direct, fastapi = (http.post(path, content=body, headers={"content-type": content_type,
                                                                  "x-request-id": "same-id"})
                           for content_type in ("application/json", FASTAPI_JSON))
    assert direct.status_code == fastapi.status_code
    assert direct.content == fastapi.content
    if direct.status_code != 200:
        assert "error_type" in direct.json() if path in ("/", "/similarity") else \
            direct.json() == {"id": "same-id", "message": direct.json()["message"]}
