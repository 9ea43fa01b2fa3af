"""TEI's ``POST /`` and ``POST /similarity``: the routes ``huggingface_hub``'s ``InferenceClient`` calls.

``InferenceClient(base_url=URL)`` posts every task to ``URL`` itself, i.e. ``POST /``.
TEI's ``/`` is one of its routes, chosen at start-up by the model's kind
(a classifier's ``/predict``, a reranker's ``/rerank``, an embedder's ``/embed``, or
``/similarity`` when started with ``TASK=sentence-similarity``). Here one
gateway may serve several models and every body has its own fields, so ``/``
dispatches per request, by the body first and the model's task second:

- ``query`` + ``texts`` (TEI's ``/rerank`` body): the reranker's ``/rerank``;
- ``inputs: {source_sentence, sentences}`` (``sentence_similarity``): cosine
  similarities of an embedder's vectors (TEI's ``/similarity``), or, on a
  cross-encoder, its score of each (source, sentence) pair with the sigmoid
  (what sentence-transformers' ``CrossEncoder.predict`` gives for such pairs);
- ``inputs``: texts or token ids (``feature_extraction``): an embedder's ``/embed``;
  another task's model goes through ``PLAIN_INPUTS_BY_TASK`` (the classification hook).

The model: the body's ``model`` (an extension), else the only served model
that can answer the body. Errors take TEI's shape (``error_shapes``).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import numpy as np
from fastapi import APIRouter, Request
from fastapi.responses import Response

from embedserve.errors import EmbedServeError, InvalidInput
from embedserve.gateway.classify_inputs import pack_items, predict_items
from embedserve.gateway.pipeline import Gateway, timed
from embedserve.gateway.priority import request_priority
from embedserve.gateway.routes import embed as embed_routes
from embedserve.gateway.routes import rerank as rerank_routes
from embedserve.gateway.routes.classify import predictions
from embedserve.gateway.routes.embed import json_response
from embedserve.gateway.routes.error_shapes import (
    TeiErrorResponse,
    TeiRoute,
    error_responses,
    tei_error,
)
from embedserve.gateway.routes.tei_schemas import (
    RootParameters,
    RootRequest,
    RootResponse,
    SimilarityInput,
    SimilarityParameters,
    SimilarityRequest,
)
from embedserve.gateway.routing import ModelRouter
from embedserve.gateway.schemas import EmbedRequest, RerankRequest

router = APIRouter(route_class=TeiRoute, responses=error_responses(TeiErrorResponse))

# The body InferenceClient.sentence_similarity sends, for messages.
_SIMILARITY_BODY = '{"inputs": {"source_sentence": ..., "sentences": [...]}}'


@router.post("/", response_model=RootResponse, tags=["TEI"],
             summary="TEI's / : embed, similarity or rerank, by the body and the served model "
                     "(huggingface_hub InferenceClient's URL)")
async def root(body: RootRequest, request: Request) -> Response:
    try:
        return await _root(body, request)
    except EmbedServeError as exc:
        return tei_error(exc, request)


@router.post("/similarity", response_model=list[float], tags=["TEI"],
             summary="Similarity of a source sentence to each sentence "
                     "(text-embeddings-inference-compatible)")
async def similarity(body: SimilarityRequest, request: Request) -> Response:
    try:
        return await _similarity(body.inputs, body.parameters or SimilarityParameters(),
                                 body.model, body.priority, request, "/similarity")
    except EmbedServeError as exc:
        return tei_error(exc, request)


async def _root(body: RootRequest, request: Request) -> Response:
    if body.query is not None or body.texts is not None:
        return await _rerank(body, request)
    if isinstance(body.inputs, SimilarityInput):
        parameters = body.parameters or SimilarityParameters()
        return await _similarity(body.inputs, parameters, body.model, body.priority, request, "/")
    if body.inputs is None:
        raise InvalidInput("the body needs `inputs` (texts or token ids to embed, or "
                           f"{_SIMILARITY_BODY}), or `query` and `texts` to rerank", field="inputs")
    gateway = pick_model(request.app.state.router, body.model, ("embed", "classify"))
    answer = PLAIN_INPUTS_BY_TASK.get(gateway.task, _no_plain_inputs)
    return await answer(gateway, body, request)


def pick_model(models: ModelRouter, name: str | None, tasks: tuple[str, ...]) -> Gateway:
    """The model a body goes to: the one ``name``s, the only one served, else the only one
    of the first of ``tasks`` that any served model does (several: a 400 asking for ``model``)."""
    if name is not None:
        return models.find(name)
    if len(models.gateways) == 1:
        return models.gateways[0]
    for task in tasks:
        if any(g.task == task for g in models.gateways):
            return models.route(None, task)[0]
    return models.route(None, tasks[0])[0]   # none: a 400 listing what is served


async def _embed_inputs(gateway: Gateway, body: RootRequest, request: Request) -> Response:
    """``feature_extraction``: TEI's ``/embed`` (a list of vectors)."""
    if body.encoding_format == "base64":
        raise InvalidInput("encoding_format 'base64' is OpenAI's (POST /v1/embeddings); "
                           "POST / answers TEI's list of float vectors", field="encoding_format")
    parameters = body.parameters or SimilarityParameters()
    embed_body = EmbedRequest.model_construct(
        inputs=body.inputs, model=gateway.model_id, normalize=body.normalize,
        truncate=body.truncate if body.truncate is not None else parameters.truncate,
        truncation_direction=body.truncation_direction or parameters.truncation_direction,
        chunk_overlap=None, prompt_name=body.prompt_name or parameters.prompt_name,
        dimensions=body.dimensions, embedding_types=body.embedding_types, priority=body.priority)
    return await embed_routes.embed(embed_body, request)


async def _needs_pairs(gateway: Gateway, body: RootRequest, request: Request) -> Response:
    raise InvalidInput(f"the model `{gateway.model_id}` is a reranker (cross-encoder): it scores "
                       f"pairs, so POST / takes `query` and `texts` (TEI's /rerank) or "
                       f"{_SIMILARITY_BODY} for it", field="inputs")


async def _no_plain_inputs(gateway: Gateway, body: RootRequest, request: Request) -> Response:
    raise InvalidInput(f"POST / does not serve `{gateway.model_id}`'s task ({gateway.task}) "
                       f"yet", field="model")


# What ``inputs`` (texts or ids) means on ``POST /`` for each task.
#
async def _classify_inputs(gateway: Gateway, body: RootRequest, request: Request) -> Response:
    """``text_classification``: TEI's /predict (a text, a [text, text] pair, or a batch of
    them), always answered as a list of {label, score} lists, highest first: InferenceClient
    sends {"inputs": text, "parameters": {"function_to_apply", "top_k"}} and reads
    ``answer[0]``, as from the HF Inference API (TEI's bare list for one input would give it
    one element). ``function_to_apply: "none"`` (or ``raw_scores``) answers the logits."""
    parameters = body.parameters or RootParameters()
    if parameters.function_to_apply not in (None, "none", "softmax", "sigmoid"):
        raise InvalidInput("function_to_apply is one of none, softmax, sigmoid",
                           field="parameters.function_to_apply")
    if parameters.top_k is not None and parameters.top_k < 1:
        raise InvalidInput("top_k must be at least 1", field="parameters.top_k")
    texts = [body.inputs] if isinstance(body.inputs, str) else body.inputs
    if not isinstance(texts, list) or not all(isinstance(item, (str, list)) for item in texts):
        raise InvalidInput("a classifier takes texts (or [text, text] pairs), not token ids", field="inputs")
    request_priority(request.scope, body.priority, gateway.settings.route_priorities)
    items, _ = predict_items(body.inputs)  # type: ignore[arg-type]  # texts: checked above
    gateway.check_count(len(items), "inputs")
    packed = await timed(request, "tokenize", pack_items(
        gateway.preprocessor, items, bool(body.truncate), body.truncation_direction or "right", "inputs"))
    raw = body.raw_scores or parameters.function_to_apply == "none"
    scores = await gateway.classify(request, packed, raw, "/")
    answers = [predictions(row, gateway.model.labels)[:parameters.top_k] for row in scores]
    return json_response(answers)


PLAIN_INPUTS_BY_TASK: dict[str, Callable[[Gateway, RootRequest, Request], Awaitable[Response]]] = {
    "embed": _embed_inputs,
    "score": _needs_pairs,
    "classify": _classify_inputs,
}


async def _rerank(body: RootRequest, request: Request) -> Response:
    """TEI's ``/rerank`` body on ``/``."""
    if body.query is None or body.texts is None:
        missing = "query" if body.query is None else "texts"
        raise InvalidInput(f"reranking takes both `query` and `texts`; `{missing}` is missing",
                           field=missing)
    if body.truncate is not None and not isinstance(body.truncate, bool):
        raise InvalidInput("truncate is true or false when reranking", field="truncate")
    gateway = pick_model(request.app.state.router, body.model, ("score",))
    rerank_body = RerankRequest.model_construct(
        query=body.query, model=gateway.model_id, texts=body.texts, raw_scores=body.raw_scores,
        return_text=body.return_text, truncate=bool(body.truncate),
        truncation_direction=body.truncation_direction or "right", priority=body.priority)
    return await rerank_routes.rerank(rerank_body, request)


async def _similarity(inputs: SimilarityInput, parameters: SimilarityParameters, name: str | None,
                      priority: str | None, request: Request, route: str) -> Response:
    """The similarity of ``inputs.source_sentence`` to each of ``inputs.sentences``."""
    gateway = pick_model(request.app.state.router, name, ("embed", "score"))
    request_priority(request.scope, priority, gateway.settings.route_priorities)
    if not inputs.sentences:
        raise InvalidInput("inputs.sentences must not be empty", field="inputs.sentences")
    if gateway.task == "score":
        scores = await _pair_scores(gateway, inputs, parameters, request, route)
        return json_response([float(s) for s in scores])
    gateway.require_task("embed")
    policy = gateway.preprocessor.long_input_policy(parameters.truncate,
                                                    parameters.truncation_direction, None)
    texts = [inputs.source_sentence, *inputs.sentences]
    # /embed's own steps (prompt, tokenization, the long-input policy with its windows),
    # used rather than copied.
    packed = await embed_routes._pack(gateway, request, texts, "inputs", parameters.prompt_name, policy)
    # Raw vectors (full width, not normalized): the cosine is taken here, in float64.
    vectors, _ = await embed_routes._embed(gateway, request, packed, policy, False, 0, route)
    return json_response(cosine_similarities(np.asarray(vectors[0]), np.asarray(vectors[1:])))


def cosine_similarities(source: np.ndarray, others: np.ndarray) -> list[float]:
    """cos(source, others[i]) for each i, in float64; 0 against a zero vector."""
    source = source.astype(np.float64)
    others = others.astype(np.float64)
    norms = np.linalg.norm(others, axis=1) * np.linalg.norm(source)
    dots = others @ source
    return [float(d / n) if n > 0 else 0.0 for d, n in zip(dots, norms)]


async def _pair_scores(gateway: Gateway, inputs: SimilarityInput, parameters: SimilarityParameters,
                       request: Request, route: str) -> np.ndarray:
    """A cross-encoder's sigmoid score of (source, sentence) per sentence."""
    if parameters.prompt_name is not None:
        raise InvalidInput("a reranker has no prompts", field="parameters.prompt_name")
    policy = gateway.preprocessor.long_input_policy(parameters.truncate,
                                                    parameters.truncation_direction, None)
    if policy.mode == "chunk":
        raise InvalidInput("truncate 'chunk' pools embeddings; a reranker truncates or refuses",
                           field="parameters.truncate")
    gateway.check_count(len(inputs.sentences), "inputs.sentences")
    packed = await timed(request, "tokenize", gateway.preprocessor.pack_pairs(
        inputs.source_sentence, inputs.sentences, policy.mode == "truncate", policy.direction,
        "inputs.sentences"))
    return await gateway.score(request, packed, True, route)
