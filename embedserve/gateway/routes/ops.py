"""Operational routes: health, readiness, model info, model list, metrics.

``/health`` answers while the process is alive; ``/ready`` only once the
tokenizer is loaded and at least one replica's health watch says SERVING
(load balancers route on it). ``/info`` merges the model directory's facts
with what the replicas report.
"""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST

from embedserve import __version__
from embedserve.gateway.embedding_types import EMBEDDING_TYPES
from embedserve.gateway.http_errors import error_response
from embedserve.gateway.schemas import ModelList
from embedserve.gateway.pipeline import Gateway

router = APIRouter()


@router.get("/health", tags=["ops"], summary="The process is alive")
async def health() -> dict:
    return {"status": "ok"}


@router.get("/ready", tags=["ops"], summary="Tokenizer loaded and at least one replica serving")
async def ready(request: Request) -> Response:
    gateway: Gateway = request.app.state.gateway
    healthy = len(gateway.pool.healthy())
    if healthy == 0:
        return error_response(503, "no replica is ready", None, "unavailable")
    return JSONResponse({"status": "ready", "replicas_healthy": healthy})


@router.get("/info", tags=["ops"], summary="The served model and the replicas")
async def info(request: Request) -> dict:
    gateway: Gateway = request.app.state.gateway
    model, settings = gateway.model, gateway.settings
    return {
        "model_id": gateway.model_id,
        "served_model_names": list(gateway.served_names),
        "model_type": "reranker" if model.task == "score" else "embedding",
        "dimension": model.dimension,
        "max_input_length": model.max_positions,
        "max_client_batch_size": settings.max_inputs,
        "max_inflight_tokens": settings.max_inflight_tokens,
        "normalize": model.normalize,
        "prompts": model.prompts,
        "default_prompt_name": model.default_prompt_name,
        "device": model.device,
        "model_dtype": model.dtype,
        "version": __version__,
        "quantization": {
            "embedding_types": list(EMBEDDING_TYPES),
            # int8/uint8 ranges: computed once per model and dtype from a fixed text
            # sample (embedserve/calibration.py); null where the replica has none.
            "calibration_id": model.calibration_id,
            "calibration_sample_size": model.calibration_sample_size,
            "calibration_texts_id": model.calibration_texts_id,
            "ranges": "/v1/quantization/ranges?dimensions=D&normalize=B",
        } if model.task == "embed" else None,
        "replicas": [{"address": r.address, "healthy": r.healthy,
                      "outstanding_tokens": r.outstanding_tokens} for r in gateway.pool.replicas],
    }


@router.get("/v1/models", response_model=ModelList, tags=["OpenAI"], summary="List models")
async def list_models(request: Request) -> dict:
    gateway: Gateway = request.app.state.gateway
    # Exactly the names a request's ``model`` may use, the canonical one first.
    return {"object": "list", "data": [{"id": name, "object": "model", "created": 0,
                                        "owned_by": "embedserve"} for name in gateway.served_names]}


@router.get("/metrics", tags=["ops"], summary="Prometheus metrics", response_class=PlainTextResponse)
async def metrics(request: Request) -> Response:
    gateway: Gateway = request.app.state.gateway
    gateway.metrics.replicas_healthy.set(len(gateway.pool.healthy()))
    gateway.metrics.replicas_known.set(len(gateway.pool.replicas))
    return Response(gateway.metrics.render(), media_type=CONTENT_TYPE_LATEST)
