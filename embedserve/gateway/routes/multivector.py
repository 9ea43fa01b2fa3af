"""Multi-vector routes: TEI ``POST /embed_all`` (every kept token's vector per input).

A multi-vector (ColBERT) model's answer: per input, its token vectors after the model's
projection, its skiplist (documents by default) and normalization, as
sentence-transformers' ``MultiVectorEncoder`` returns them (docs/tasks.md). TEI's
shape: a list per input of token vectors. ``input_type`` (an embedserve extension:
"document", the default, or "query") chooses the marker prompt and whether the skiplist
applies, as ``encode_document`` / ``encode_query`` do; ``prompt_name`` names another
prompt. An embedding model answers it as TEI does: every token's last hidden state,
special tokens included, with no pooling, normalization or Dense (the replica's step
computes them only when a call asks: engine/token_rows.py). Reranking by MaxSim is
routes/rerank.py's.
"""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import Response

from embedserve.gateway.multivector_outputs import check_multivector_policy, token_vectors
from embedserve.gateway.routes.embed import json_response
from embedserve.gateway.task_schemas import EmbedAllRequest

router = APIRouter()


@router.post("/embed_all", response_model=list[list[list[float]]], tags=["TEI"],
             summary="Token vectors of a multi-vector model, or an embedder's last hidden states "
                     "(text-embeddings-inference-compatible)")
async def embed_all(body: EmbedAllRequest, request: Request) -> Response:
    gateway, _ = request.app.state.router.route(body.model, "tokens")
    policy = gateway.preprocessor.long_input_policy(body.truncate, body.truncation_direction, None)
    check_multivector_policy(policy)
    texts = [body.inputs] if isinstance(body.inputs, str) else list(body.inputs)
    gateway.check_count(len(texts), "inputs")
    rows, _ = await token_vectors(gateway, request, texts, body.input_type, body.prompt_name, policy,
                                  "inputs", "/embed_all")
    return json_response(rows)
