"""Embedding routes: OpenAI ``POST /v1/embeddings`` and TEI ``POST /embed``.

Owns translating those JSON shapes into ``Gateway.embed`` calls and the
answers back, byte-for-byte in each API's shape (OpenAI: ``data`` objects
with ``float`` lists or little-endian float32 base64, plus ``usage``; TEI: a
bare list of vectors), and running an input longer than the model's window
under the request's long-input policy (``long_inputs``). Responses are
serialized directly rather than through pydantic: thousands of vectors
would otherwise cost more than the inference.
"""

from __future__ import annotations

import time

import numpy as np
import orjson
from fastapi import APIRouter, Request
from fastapi.responses import Response

from embedserve.errors import InvalidInput
from embedserve.gateway import embedding_types
from embedserve.gateway.long_inputs import EMBED_TOO_LONG_FIX, LongInputPolicy, says_how_to_fix
from embedserve.gateway.middleware import TIMING_KEY, since_start
from embedserve.gateway.pipeline import Gateway, timed
from embedserve.gateway.priority import request_priority
from embedserve.gateway.schemas import (
    EmbeddingsByType,
    EmbeddingsRequest,
    EmbeddingsResponse,
    EmbedRequest,
    QuantizationRanges,
)
from embedserve.gateway.sparse_outputs import check_sparse_policy, sparse_vectors
from embedserve.link import wire
from embedserve.model.postprocess import postprocess_embeddings
from embedserve.model.quantize import RANGED_PRECISIONS, quantize
from embedserve.model.windows import Windows, pool_windows
from embedserve.ragged import RaggedBatch

router = APIRouter()


def json_response(payload: object) -> Response:
    """``payload`` as compact JSON. orjson writes NumPy arrays and scalars itself (rows from
    ``embedding_types.json_rows``) and floats as their shortest round-trip text, as
    ``json.dumps`` does, at a tenth of its time for a vector of a few hundred floats."""
    return Response(orjson.dumps(payload, option=orjson.OPT_SERIALIZE_NUMPY),
                    media_type="application/json")


async def _pack(gateway: Gateway, request: Request, raw, field: str, prompt_name: str | None,
                policy: LongInputPolicy) -> RaggedBatch:
    """One of the accepted input forms -> packed ids, counted and checked against ``policy``."""
    if isinstance(raw, str):
        raw = [raw]
    if len(raw) == 0:
        raise InvalidInput(f"{field} must not be empty", field=field)
    gateway.check_count(len(raw), field)
    truncate = policy.mode == "truncate"
    refuse = policy.mode == "refuse"
    if isinstance(raw[0], str):
        prompt = gateway.model.prompt(prompt_name, "input_type" if field == "input" else "prompt_name")
        with says_how_to_fix(EMBED_TOO_LONG_FIX):
            return await timed(request, "tokenize", gateway.preprocessor.encode_texts(
                raw, prompt, truncate, policy.direction, field, check_length=refuse))
    if prompt_name is not None:
        raise InvalidInput("a prompt cannot be applied to token ids; send text instead",
                           field="input_type" if field == "input" else "prompt_name")
    sequences = [raw] if isinstance(raw[0], int) else raw
    with says_how_to_fix(EMBED_TOO_LONG_FIX):
        return gateway.preprocessor.pack_ids(sequences, truncate, policy.direction, field,
                                             check_length=refuse)


async def _embed(gateway: Gateway, request: Request, packed: RaggedBatch, policy: LongInputPolicy,
                 normalize: bool, dimensions: int, route: str) -> tuple[np.ndarray, int]:
    """Vectors [B, d] for ``packed`` under ``policy``, and the tokens embedded for them."""
    windows = _split_windows(gateway, packed, policy)
    if windows is not None:
        return await _pooled(gateway, request, windows, normalize, dimensions, route)
    return await gateway.embed(request, packed, normalize, dimensions, route), packed.num_tokens


def _split_windows(gateway: Gateway, packed: RaggedBatch, policy: LongInputPolicy) -> Windows | None:
    """The windows of ``packed`` when the chunk policy cuts some input into several, else None."""
    if policy.mode != "chunk":
        return None
    windows = gateway.preprocessor.cut_windows(packed, policy.overlap)
    return windows if windows.split else None


async def _pooled(gateway: Gateway, request: Request, windows: Windows, normalize: bool,
                  dimensions: int, route: str) -> tuple[np.ndarray, int]:
    """An input cut into windows needs its windows' raw vectors (full width, not
    normalized): they are pooled here, then cut to ``dimensions`` and normalized, the
    order sentence-transformers' ``truncate_dim`` uses."""
    raw = await gateway.embed(request, windows.batch, False, 0, route)
    vectors = postprocess_embeddings(pool_windows(raw, windows), normalize, dimensions or None)
    return vectors, windows.batch.num_tokens


@router.post("/v1/embeddings", response_model=EmbeddingsResponse, tags=["OpenAI"],
             summary="Create embeddings (OpenAI-compatible)")
async def create_embeddings(body: EmbeddingsRequest, request: Request) -> Response:
    since_start(request.scope, "parse")
    if body.sparse or body.top_k is not None:
        return await _create_sparse_embeddings(body, request)
    gateway, model = request.app.state.router.route(body.model, "embed")
    request_priority(request.scope, body.priority, gateway.settings.route_priorities)
    dimensions = gateway.check_dimensions(body.dimensions)
    # OpenAI rejects over-long inputs; ``truncate`` (an extension) may cut or pool them instead.
    policy = gateway.preprocessor.long_input_policy(body.truncate, body.truncation_direction,
                                                    body.chunk_overlap)
    packed = await _pack(gateway, request, body.input, "input", body.input_type, policy)
    if body.embedding_types is not None:
        by_type, tokens = await _embed_by_type(gateway, request, packed, policy, body.embedding_types,
                                               gateway.model.normalize, dimensions, "/v1/embeddings",
                                               body.encoding_format == "base64")
        items = [{name: rows[i] for name, rows in by_type.items()}
                 for i in range(packed.num_sequences)]
    else:
        vectors, tokens = await _embed(gateway, request, packed, policy, gateway.model.normalize,
                                       dimensions, "/v1/embeddings")
        items = embedding_types.json_rows(vectors, body.encoding_format == "base64")
    encoding = time.perf_counter()
    response = json_response({
        "object": "list",
        "data": [{"object": "embedding", "index": i, "embedding": e} for i, e in enumerate(items)],
        "model": model,
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
    })
    request.scope[TIMING_KEY]["encode"] = time.perf_counter() - encoding
    return response


async def _create_sparse_embeddings(body: EmbeddingsRequest, request: Request) -> Response:
    """``"sparse": true``: a SPLADE model's nonzeros as data[i].embedding = {indices, values}."""
    if not body.sparse:
        raise InvalidInput("top_k applies to sparse embeddings; send \"sparse\": true", field="top_k")
    for name, value in (("embedding_types", body.embedding_types), ("dimensions", body.dimensions)):
        if value is not None:
            raise InvalidInput(f"{name} does not apply to sparse embeddings", field=name)
    # encoding_format is not refused: the openai client asks for base64 unless told
    # otherwise, and passes an answer that is not a string through as it is.
    gateway, model = request.app.state.router.route(body.model, "sparse")
    request_priority(request.scope, body.priority, gateway.settings.route_priorities)
    policy = gateway.preprocessor.long_input_policy(body.truncate, body.truncation_direction,
                                                    body.chunk_overlap)
    check_sparse_policy(policy)
    packed = await _pack(gateway, request, body.input, "input", body.input_type, policy)
    rows = await sparse_vectors(gateway, request, packed, body.top_k, "/v1/embeddings")
    tokens = packed.num_tokens
    return json_response({
        "object": "list",
        "data": [{"object": "embedding", "index": i,
                  "embedding": {"indices": ids.tolist(), "values": vals.tolist()}}
                 for i, (ids, vals) in enumerate(rows)],
        "model": model,
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
    })


async def _embed_by_type(gateway: Gateway, request: Request, packed: RaggedBatch,
                         policy: LongInputPolicy, types: list[str], normalize: bool, dimensions: int,
                         route: str, as_base64: bool) -> tuple[dict[str, list], int]:
    """JSON rows per requested embedding type, and the tokens embedded."""
    types = embedding_types.check_embedding_types(types)
    arrays, tokens = await embed_types(gateway, request, packed, policy, types, normalize,
                                       dimensions, route)
    return {name: embedding_types.json_rows(a, as_base64) for name, a in zip(types, arrays)}, tokens


async def embed_types(gateway: Gateway, request: Request, packed: RaggedBatch,
                      policy: LongInputPolicy, types: list[str], normalize: bool, dimensions: int,
                      route: str) -> tuple[list[np.ndarray], int]:
    """The vectors [B, w] in each of the checked ``types``, and the tokens embedded (the
    gRPC API's Embed uses it too: gateway/grpc_api.py).

    The replicas quantize after truncation and normalization. Inputs pooled from
    windows are pooled here, so here they are quantized, with the replicas' own
    calibration ranges for the same (dimensions, normalize): the same buckets.
    """
    wanted = embedding_types.precisions(types)
    windows = _split_windows(gateway, packed, policy)
    if windows is not None:
        vectors, tokens = await _pooled(gateway, request, windows, normalize, dimensions, route)
        ranges = None
        if any(p in RANGED_PRECISIONS for p in wanted):
            reply = await gateway.ranges(dimensions, normalize)
            ranges = wire.tensor_to_array(reply.ranges, field="Ranges.ranges")
        arrays = [quantize(vectors, p, ranges) for p in wanted]
    else:
        arrays = await gateway.embed_quantized(request, packed, normalize, dimensions, wanted, route)
        tokens = packed.num_tokens
    return arrays, tokens


@router.post("/embed", response_model=list[list[float]] | EmbeddingsByType, tags=["TEI"],
             summary="Embed inputs (text-embeddings-inference-compatible)")
async def embed(body: EmbedRequest, request: Request) -> Response:
    since_start(request.scope, "parse")
    gateway, _ = request.app.state.router.route(body.model, "embed")
    request_priority(request.scope, body.priority, gateway.settings.route_priorities)
    dimensions = gateway.check_dimensions(body.dimensions)
    policy = gateway.preprocessor.long_input_policy(body.truncate, body.truncation_direction,
                                                    body.chunk_overlap)
    packed = await _pack(gateway, request, body.inputs, "inputs", body.prompt_name, policy)
    if body.embedding_types is not None:
        by_type, _ = await _embed_by_type(gateway, request, packed, policy, body.embedding_types,
                                          body.normalize, dimensions, "/embed", False)
        return json_response({"embeddings": by_type, "response_type": "embeddings_by_type"})
    vectors, _ = await _embed(gateway, request, packed, policy, body.normalize, dimensions, "/embed")
    return json_response(embedding_types.json_rows(np.asarray(vectors), False))


@router.get("/v1/quantization/ranges", response_model=QuantizationRanges, tags=["embedserve"],
            summary="The int8/uint8 calibration ranges for a dimensions and normalize setting")
async def quantization_ranges(request: Request, dimensions: int | None = None,
                              normalize: bool | None = None, model: str | None = None) -> Response:
    """What int8/uint8 vectors are bucketed with: ``quantize_embeddings(v, "int8",
    ranges=np.array(ranges, np.float32))`` of the float answer equals the int8 answer.
    ``normalize`` defaults to the model's (what /v1/embeddings uses)."""
    gateway, _ = request.app.state.router.route(model, "embed")
    dims = gateway.check_dimensions(dimensions)
    normalize = gateway.model.normalize if normalize is None else normalize
    reply = await gateway.ranges(dims, normalize)
    ranges = wire.tensor_to_array(reply.ranges, field="Ranges.ranges")
    return json_response({"calibration_id": reply.calibration_id, "sample_size": reply.sample_size,
                          "dimensions": int(ranges.shape[1]), "normalize": normalize,
                          "ranges": ranges.tolist()})
