"""Embedding routes: OpenAI ``POST /v1/embeddings`` and TEI ``POST /embed``.

Owns translating those JSON shapes into ``Gateway.embed`` calls and the
answers back, byte-for-byte in each API's shape (OpenAI: ``data`` objects
with ``float`` lists or little-endian float32 base64, plus ``usage``; TEI: a
bare list of vectors). Responses are serialized directly rather than through
pydantic: thousands of vectors would otherwise cost more than the inference.
"""

from __future__ import annotations

import base64
import json

import numpy as np
from fastapi import APIRouter, Request
from fastapi.responses import Response

from embedserve import wire
from embedserve.errors import InvalidInput
from embedserve.gateway import embedding_types
from embedserve.gateway.pipeline import Gateway, timed
from embedserve.gateway.schemas import (EmbeddingsByType, EmbeddingsRequest, EmbeddingsResponse,
                                        EmbedRequest, QuantizationRanges)
from embedserve.ragged import RaggedBatch

router = APIRouter()


def json_response(payload: object) -> Response:
    return Response(json.dumps(payload, separators=(",", ":")), media_type="application/json")


async def _pack(gateway: Gateway, request: Request, raw, field: str, prompt_name: str | None,
                truncate: bool, direction: str) -> RaggedBatch:
    """One of the accepted input forms -> packed ids, counted and checked."""
    if isinstance(raw, str):
        raw = [raw]
    if len(raw) == 0:
        raise InvalidInput(f"{field} must not be empty", field=field)
    gateway.check_count(len(raw), field)
    if isinstance(raw[0], str):
        prompt = gateway.model.prompt(prompt_name, "input_type" if field == "input" else "prompt_name")
        return await timed(request, "tokenize", gateway.preprocessor.encode_texts(
            raw, prompt, truncate, direction, field))
    if prompt_name is not None:
        raise InvalidInput("a prompt cannot be applied to token ids; send text instead",
                           field="input_type" if field == "input" else "prompt_name")
    sequences = [raw] if isinstance(raw[0], int) else raw
    return gateway.preprocessor.pack_ids(sequences, truncate, direction, field)


@router.post("/v1/embeddings", response_model=EmbeddingsResponse, tags=["OpenAI"],
             summary="Create embeddings (OpenAI-compatible)")
async def create_embeddings(body: EmbeddingsRequest, request: Request) -> Response:
    gateway: Gateway = request.app.state.gateway
    model = gateway.check_model(body.model)
    gateway.require_task("embed")
    dimensions = gateway.check_dimensions(body.dimensions)
    # OpenAI rejects over-long inputs; ``truncate`` (an extension) cuts them instead.
    packed = await _pack(gateway, request, body.input, "input", body.input_type, body.truncate, "right")
    if body.embedding_types is not None:
        by_type = await _embed_by_type(gateway, request, packed, body.embedding_types,
                                       gateway.model.normalize, dimensions, "/v1/embeddings",
                                       body.encoding_format == "base64")
        items = [{name: rows[i] for name, rows in by_type.items()}
                 for i in range(packed.num_sequences)]
    else:
        items = await _openai_items(gateway, request, packed, dimensions, body.encoding_format)
    tokens = packed.num_tokens
    return json_response({
        "object": "list",
        "data": [{"object": "embedding", "index": i, "embedding": e} for i, e in enumerate(items)],
        "model": model,
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
    })


async def _openai_items(gateway: Gateway, request: Request, packed: RaggedBatch, dimensions: int,
                        encoding_format: str) -> list:
    vectors = await gateway.embed(request, packed, gateway.model.normalize, dimensions, "/v1/embeddings")
    if encoding_format == "base64":
        little = vectors.astype("<f4", copy=False)
        items = [base64.b64encode(row.tobytes()).decode("ascii") for row in little]
    else:
        items = vectors.tolist()
    return items


async def _embed_by_type(gateway: Gateway, request: Request, packed: RaggedBatch, types: list[str],
                         normalize: bool, dimensions: int, route: str,
                         as_base64: bool) -> dict[str, list]:
    """JSON rows per requested embedding type (the replicas quantize after truncation and
    normalization)."""
    types = embedding_types.check_embedding_types(types)
    arrays = await gateway.embed_quantized(request, packed, normalize, dimensions,
                                           embedding_types.precisions(types), route)
    return {name: embedding_types.json_rows(array, as_base64) for name, array in zip(types, arrays)}


@router.post("/embed", response_model=list[list[float]] | EmbeddingsByType, tags=["TEI"],
             summary="Embed inputs (text-embeddings-inference-compatible)")
async def embed(body: EmbedRequest, request: Request) -> Response:
    gateway: Gateway = request.app.state.gateway
    gateway.require_task("embed")
    dimensions = gateway.check_dimensions(body.dimensions)
    packed = await _pack(gateway, request, body.inputs, "inputs", body.prompt_name, body.truncate,
                         body.truncation_direction)
    if body.embedding_types is not None:
        by_type = await _embed_by_type(gateway, request, packed, body.embedding_types,
                                       body.normalize, dimensions, "/embed", False)
        return json_response({"embeddings": by_type, "response_type": "embeddings_by_type"})
    vectors = await gateway.embed(request, packed, body.normalize, dimensions, "/embed")
    return json_response(np.asarray(vectors).tolist())


@router.get("/v1/quantization/ranges", response_model=QuantizationRanges, tags=["embedserve"],
            summary="The int8/uint8 calibration ranges for a dimensions and normalize setting")
async def quantization_ranges(request: Request, dimensions: int | None = None,
                              normalize: bool | None = None) -> Response:
    """What int8/uint8 vectors are bucketed with: ``quantize_embeddings(v, "int8",
    ranges=np.array(ranges, np.float32))`` of the float answer equals the int8 answer.
    ``normalize`` defaults to the model's (what /v1/embeddings uses)."""
    gateway: Gateway = request.app.state.gateway
    gateway.require_task("embed")
    dims = gateway.check_dimensions(dimensions)
    normalize = gateway.model.normalize if normalize is None else normalize
    reply = await gateway.ranges(dims, normalize)
    ranges = wire.tensor_to_array(reply.ranges, field="Ranges.ranges")
    return json_response({"calibration_id": reply.calibration_id, "sample_size": reply.sample_size,
                          "dimensions": int(ranges.shape[1]), "normalize": normalize,
                          "ranges": ranges.tolist()})
