"""Cohere's v2 API: ``POST /v2/embed`` and ``POST /v2/rerank`` (``cohere.ClientV2``).

Owns translating Cohere's fields onto the gateway's: ``input_type`` onto the
model's named prompts (``INPUT_TYPE_PROMPTS``), ``embedding_types`` onto the
precisions replicas quantize to (``embedding_types.py``; ``base64`` is the
float32 vectors' little-endian bytes), ``output_dimension`` onto Matryoshka
``dimensions``, ``truncate`` (NONE/START/END, default END as Cohere's) onto the
long-input policy; and the answers back in Cohere's shapes (``id``,
``embeddings`` by type, ``texts``, ``meta``; ranked ``results`` with
``relevance_score``, the sigmoid of the cross-encoder's logit). Errors take
Cohere's shape (``error_shapes``). The older Cohere/Jina ``/v1/rerank`` is
``rerank.py``'s.
"""

from __future__ import annotations

import base64

import numpy as np
from fastapi import APIRouter, Request
from fastapi.responses import Response

from embedserve.errors import EmbedServeError, InvalidInput
from embedserve.gateway import embedding_types
from embedserve.gateway.middleware import REQUEST_ID_KEY
from embedserve.gateway.pipeline import Gateway, timed
from embedserve.gateway.priority import request_priority
from embedserve.gateway.routes import embed as embed_routes
from embedserve.gateway.routes.cohere_schemas import (
    CohereEmbedRequest,
    CohereEmbedResponse,
    CohereV2RerankRequest,
    CohereV2RerankResponse,
)
from embedserve.gateway.routes.embed import json_response
from embedserve.gateway.routes.error_shapes import (
    CohereErrorResponse,
    CohereRoute,
    cohere_error,
    error_responses,
)
from embedserve.gateway.routes.rerank import maxsim_scores
from embedserve.link.wire import BATCH
from embedserve.model.info import ModelInfo

router = APIRouter(route_class=CohereRoute, responses=error_responses(CohereErrorResponse))

# Cohere's input_type -> the prompt names that mean it, first found wins (case-insensitive).
# nomic-embed uses Cohere's own names; e5 "query"/"passage"; EmbeddingGemma "query",
# "document", "Classification", "Clustering"; others "corpus".
INPUT_TYPE_PROMPTS: dict[str, tuple[str, ...]] = {
    "search_query": ("search_query", "query"),
    "search_document": ("search_document", "document", "passage", "corpus"),
    "classification": ("classification",),
    "clustering": ("clustering",),
}
TRUNCATE_VALUES = ("NONE", "START", "END")
BASE64 = "base64"


@router.post("/v2/embed", response_model=CohereEmbedResponse, tags=["Cohere"],
             summary="Embed texts (Cohere v2-compatible)")
async def embed_v2(body: CohereEmbedRequest, request: Request) -> Response:
    try:
        return await _embed(body, request)
    except EmbedServeError as exc:
        return cohere_error(exc, request)


@router.post("/v2/rerank", response_model=CohereV2RerankResponse, tags=["Cohere"],
             summary="Rerank documents (Cohere v2-compatible)")
async def rerank_v2(body: CohereV2RerankRequest, request: Request) -> Response:
    try:
        return await _rerank(body, request)
    except EmbedServeError as exc:
        return cohere_error(exc, request)


def prompt_for(model: ModelInfo, input_type: str | None) -> str:
    """The prompt text ``input_type`` means for ``model``: its prompt of a matching name,
    else its default prompt (none: no prefix)."""
    if input_type is not None and input_type not in INPUT_TYPE_PROMPTS:
        accepted = ", ".join(INPUT_TYPE_PROMPTS)
        raise InvalidInput(f"input_type must be one of {accepted}, got {input_type!r}"
                           + (" (this server embeds text only)" if input_type == "image" else ""),
                           field="input_type")
    by_lower = {name.lower(): name for name in model.prompts}
    for wanted in INPUT_TYPE_PROMPTS.get(input_type or "", ()):
        if wanted in by_lower:
            return model.prompts[by_lower[wanted]]
    return model.prompt(None, "input_type")


def _class_named(priority: int | str | None) -> str | None:
    """The traffic class a Cohere body's ``priority`` names: a string is embedserve's class
    (checked by ``request_priority``). Cohere's own integer priority ranks requests, 0 (its
    default) first: 0 names no class (the header or the default decides), a larger number
    asks to be handled later, which is the batch class; a negative one is a 400."""
    if isinstance(priority, str) or priority is None:
        return priority
    if priority < 0:
        raise InvalidInput(f"priority must be a string class or an integer >= 0, got {priority}",
                           field="priority")
    return BATCH if priority > 0 else None


def _check_token_limit(value: int | None, gateway: Gateway, field: str) -> None:
    """Cohere's per-input token limits: kept when the model's window is no longer."""
    window = gateway.model.max_positions
    if value is not None and value < window:
        raise InvalidInput(f"{field} below the model's window ({window} tokens) is not supported; "
                           f"omit it (inputs are cut to the window)", field=field)


def _requested_types(types: list[str] | None) -> list[str]:
    """The embedding types asked for, each once, in order: Cohere's names plus float16."""
    if not types:
        return ["float"]
    for i, name in enumerate(types):
        if name != BASE64 and name not in embedding_types.EMBEDDING_TYPES:
            accepted = ", ".join([*embedding_types.EMBEDDING_TYPES, BASE64])
            raise InvalidInput(f"embedding_types[{i}]: unknown embedding type {name!r}; expected "
                               f"one of {accepted}", field=f"embedding_types[{i}]")
    return list(dict.fromkeys(types))


async def _embed(body: CohereEmbedRequest, request: Request) -> Response:
    gateway, _ = request.app.state.router.route(body.model, "embed")
    request_priority(request.scope, _class_named(body.priority), gateway.settings.route_priorities)
    if body.images:
        raise InvalidInput("images are not supported: this server embeds text", field="images")
    if body.inputs is not None:
        raise InvalidInput("inputs (mixed content) is not supported; send texts", field="inputs")
    if body.texts is None:
        raise InvalidInput("texts is required", field="texts")
    prompt = prompt_for(gateway.model, body.input_type)
    dimensions = gateway.check_dimensions(body.output_dimension, "output_dimension")
    truncate = (body.truncate or "END").upper()
    if truncate not in TRUNCATE_VALUES:
        raise InvalidInput(f"truncate must be one of {', '.join(TRUNCATE_VALUES)}, got "
                           f"{body.truncate!r}", field="truncate")
    _check_token_limit(body.max_tokens, gateway, "max_tokens")
    types = _requested_types(body.embedding_types)
    policy = gateway.preprocessor.long_input_policy(truncate, None, None)
    if not body.texts:
        raise InvalidInput("texts must not be empty", field="texts")
    gateway.check_count(len(body.texts), "texts")
    packed = await timed(request, "tokenize", gateway.preprocessor.encode_texts(
        body.texts, prompt, policy.mode == "truncate", policy.direction, "texts"))
    # base64 is the float vectors' bytes: computed as float, encoded here. The types
    # themselves as /v1/embeddings computes them (embed.py's step, used rather than copied).
    computed = [t for t in types if t != BASE64]
    if BASE64 in types and "float" not in computed:
        computed.append("float")
    by_type, tokens = await embed_routes._embed_by_type(
        gateway, request, packed, policy, computed, gateway.model.normalize, dimensions,
        "/v2/embed", False)
    embeddings = {name: by_type[name] for name in types if name != BASE64}
    if BASE64 in types:
        embeddings[BASE64] = [base64.b64encode(np.asarray(row, dtype="<f4").tobytes()).decode("ascii")
                              for row in by_type["float"]]
    return json_response({
        "id": request.scope.get(REQUEST_ID_KEY, ""),
        "embeddings": embeddings,
        "texts": body.texts,
        "meta": {"api_version": {"version": "2"}, "billed_units": {"input_tokens": tokens}},
        "response_type": "embeddings_by_type",
    })


async def _rerank(body: CohereV2RerankRequest, request: Request) -> Response:
    gateway, _ = request.app.state.router.route(body.model, "score")
    request_priority(request.scope, _class_named(body.priority), gateway.settings.route_priorities)
    if body.relevant_spans is not None and body.relevant_spans.mode not in (None, "disabled"):
        raise InvalidInput("relevant_spans is not supported", field="relevant_spans")
    _check_token_limit(body.max_tokens_per_doc, gateway, "max_tokens_per_doc")
    gateway.check_count(len(body.documents), "documents")
    if gateway.task == "multivector":   # MaxSim, as /v1/rerank scores such a model
        scores, _ = await maxsim_scores(gateway, request, body.query, body.documents, "documents",
                                        True, "right", "/v2/rerank")
    else:
        # Cohere cuts long documents; the pair template is cut to the window from the right.
        packed = await timed(request, "tokenize", gateway.preprocessor.pack_pairs(
            body.query, body.documents, True, "right", "documents"))
        scores = await gateway.score(request, packed, True, "/v2/rerank")
    # Highest first; ties keep input order (a stable sort), as /v1/rerank.
    order = sorted(range(len(scores)), key=lambda i: -float(scores[i]))[:body.top_n]
    return json_response({
        "id": request.scope.get(REQUEST_ID_KEY, ""),
        "results": [{"index": i, "relevance_score": float(scores[i])} for i in order],
        "meta": {"api_version": {"version": "2"}, "billed_units": {"search_units": 1}},
    })
