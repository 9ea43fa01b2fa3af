"""Reranking routes: TEI ``POST /rerank`` and Cohere/Jina ``POST /v1/rerank``.

Owns both JSON shapes over one path: tokenize the model's pair template per
document (``<s> query </s></s> doc </s>``, or BERT's ``[CLS] query [SEP] doc [SEP]``
with segment ids), score through ``Gateway.score``, sort by score (highest
first). TEI returns sigmoid scores unless ``raw_scores``; Cohere/Jina
return ``relevance_score`` in [0, 1]. A multi-vector (ColBERT) model scores by MaxSim
instead (gateway/multivector_outputs.py): its scores are MaxSim sums on both routes.
"""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import Response

from embedserve.gateway.long_inputs import RERANK_TOO_LONG_FIX, says_how_to_fix
from embedserve.gateway.multivector_outputs import check_multivector_policy, maxsim, token_vectors
from embedserve.gateway.pipeline import Gateway, timed
from embedserve.gateway.priority import request_priority
from embedserve.gateway.routes.embed import json_response
from embedserve.gateway.schemas import CohereRerankRequest, CohereRerankResponse, RankedText, RerankRequest

router = APIRouter()


async def _scores(gateway: Gateway, request: Request, query: str, docs: list[str], field: str,
                  truncate: bool, direction: str, sigmoid: bool, route: str,
                  instruction: str | None = None):
    gateway.check_count(len(docs), field)
    if gateway.task == "multivector":
        return await maxsim_scores(gateway, request, query, docs, field, truncate, direction, route)
    with says_how_to_fix(RERANK_TOO_LONG_FIX):
        packed = await timed(request, "tokenize", gateway.preprocessor.pack_pairs(
            query, docs, truncate, direction, field, instruction))
    scores = await gateway.score(request, packed, sigmoid, route)
    return scores, packed.num_tokens


async def maxsim_scores(gateway: Gateway, request: Request, query: str, docs: list[str], field: str,
                         truncate: bool, direction: str, route: str):
    """A multi-vector model's scores: the query's token vectors (query marker) against each
    document's (document marker, skiplist), by MaxSim; no sigmoid (raw_scores changes nothing)."""
    policy = gateway.preprocessor.long_input_policy(truncate, direction, None)
    check_multivector_policy(policy)
    with says_how_to_fix(RERANK_TOO_LONG_FIX):
        queries, asked = await token_vectors(gateway, request, [query], "query", None, policy, "query", route)
        documents, packed = await token_vectors(gateway, request, docs, "document", None, policy, field, route)
    spec = gateway.model.multivector
    scores = maxsim(queries[0], documents, spec.similarity if spec is not None else "maxsim")
    return scores, asked.num_tokens + packed.num_tokens


def _ranked(scores) -> list[int]:
    # Highest score first; ties keep input order (a stable sort).
    return sorted(range(len(scores)), key=lambda i: -float(scores[i]))


@router.post("/rerank", response_model=list[RankedText], tags=["TEI"],
             summary="Rerank texts against a query (text-embeddings-inference-compatible)")
async def rerank(body: RerankRequest, request: Request) -> Response:
    gateway, _ = request.app.state.router.route(body.model, "score")
    request_priority(request.scope, body.priority, gateway.settings.route_priorities)
    scores, _ = await _scores(gateway, request, body.query, body.texts, "texts", body.truncate,
                              body.truncation_direction, not body.raw_scores, "/rerank",
                              body.instruction)
    results = []
    for i in _ranked(scores):
        item: dict = {"index": i, "score": float(scores[i])}
        if body.return_text:
            item["text"] = body.texts[i]
        results.append(item)
    return json_response(results)


@router.post("/v1/rerank", response_model=CohereRerankResponse, tags=["Cohere/Jina"],
             summary="Rerank documents (Cohere/Jina-compatible)")
async def rerank_documents(body: CohereRerankRequest, request: Request) -> Response:
    gateway, model = request.app.state.router.route(body.model, "score")
    request_priority(request.scope, body.priority, gateway.settings.route_priorities)
    docs = [d if isinstance(d, str) else d.text for d in body.documents]
    scores, tokens = await _scores(gateway, request, body.query, docs, "documents", body.truncate,
                                   "right", True, "/v1/rerank", body.instruction)
    order = _ranked(scores)
    if body.top_n is not None:
        order = order[:body.top_n]
    results = []
    for i in order:
        item: dict = {"index": i, "relevance_score": float(scores[i])}
        if body.return_documents:
            item["document"] = {"text": docs[i]}
        results.append(item)
    return json_response({"model": model, "results": results,
                          "usage": {"total_tokens": tokens}})
