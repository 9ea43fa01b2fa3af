"""Sparse embedding routes: TEI ``POST /embed_sparse``, and ``/v1/embeddings``' sparse answer.

Owns the JSON of a SPLADE model's vectors: the replicas send only each input's
nonzeros (counts, indices, values; gateway/dispatch.py), so the answer is built
from those, never from a vocabulary-wide row. TEI's shape is a list per input of
``{index, value}`` by ascending index; OpenAI's ``data[i].embedding`` becomes
``{"indices": [...], "values": [...]}`` (``"sparse": true``, docs/tasks.md).
Inputs longer than the window are refused or truncated; ``truncate: "chunk"`` is
refused (pooling windows of a SPLADE model is not what it was trained for).
"""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import Response

from embedserve.gateway.priority import request_priority
from embedserve.gateway.routes.embed import _pack, json_response
from embedserve.gateway.sparse_outputs import check_sparse_policy, sparse_vectors
from embedserve.gateway.task_schemas import EmbedSparseRequest, SparseValue

router = APIRouter()


@router.post("/embed_sparse", response_model=list[list[SparseValue]], tags=["TEI"],
             summary="Sparse (SPLADE) embeddings (text-embeddings-inference-compatible)")
async def embed_sparse(body: EmbedSparseRequest, request: Request) -> Response:
    gateway, _ = request.app.state.router.route(body.model, "sparse")
    request_priority(request.scope, body.priority, gateway.settings.route_priorities)
    policy = gateway.preprocessor.long_input_policy(body.truncate, body.truncation_direction, None)
    check_sparse_policy(policy)
    packed = await _pack(gateway, request, body.inputs, "inputs", body.prompt_name, policy)
    rows = await sparse_vectors(gateway, request, packed, body.top_k, "/embed_sparse")
    return json_response([[{"index": i, "value": v} for i, v in zip(ids.tolist(), vals.tolist())]
                          for ids, vals in rows])
