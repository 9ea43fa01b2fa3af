"""Operational routes: health, readiness, model info, model list, metrics.

``/health`` answers while the process is alive; ``/ready`` only once the
tokenizers are loaded and warmed up (the app is built only then: every kernel a
route runs has been called once, so no request waits for a compile;
gateway/startup.py) and every served model has a replica whose health watch
says SERVING (a replica says so after its engine's warm-up step). Load
balancers route on it. ``/info`` merges a model
directory's facts with what its replicas report: one model's answer when
one model is served (or ``?model=NAME`` picks one), else every model's.
"""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST

from embedserve import __version__
from embedserve.gateway.embedding_types import EMBEDDING_TYPES
from embedserve.gateway.http_errors import error_response
from embedserve.gateway.pipeline import Gateway
from embedserve.gateway.routing import ModelRouter
from embedserve.gateway.schemas import ModelList
from embedserve.model.tasks import TASK_OUTPUTS

# /info's model_type per task (TEI says "embedding", "reranker" or "classifier").
MODEL_TYPES = {"embed": "embedding", "score": "reranker", "classify": "classifier", "sparse": "sparse",
               "multivector": "multi_vector"}
# The routes each task's model answers (gateway/routing.py refuses the others with a 400).
TASK_ROUTES = {"embed": ["/v1/embeddings", "/embed", "/embed_all"], "score": ["/rerank", "/v1/rerank"],
               "classify": ["/predict", "/classify"],
               "sparse": ["/embed_sparse", "/v1/embeddings (\"sparse\": true)"],
               "multivector": ["/embed_all", "/rerank", "/v1/rerank"]}

router = APIRouter()


@router.get("/health", tags=["ops"], summary="The process is alive")
async def health() -> dict:
    return {"status": "ok"}


@router.get("/ready", tags=["ops"], summary="Tokenizers warmed up and every model has a replica serving")
async def ready(request: Request) -> Response:
    models: ModelRouter = request.app.state.router
    healthy = {g.model_id: len(g.pool.healthy()) for g in models.gateways}
    waiting = [name for name, count in healthy.items() if count == 0]
    if waiting:
        message = ("no replica is ready" if len(healthy) == 1 else
                   f"no replica is ready for {', '.join(waiting)}")
        return error_response(503, message, None, "unavailable")
    return JSONResponse({"status": "ready", "replicas_healthy": sum(healthy.values()),
                         "models": healthy})


def _model_info(gateway: Gateway) -> dict:
    model, settings = gateway.model, gateway.settings
    return {
        "model_id": gateway.model_id,
        "served_model_names": list(gateway.served_names),
        "model_type": MODEL_TYPES[model.task],
        # What the model does and returns (model/tasks.py); the routes it answers follow.
        "task": model.task,
        "outputs": TASK_OUTPUTS[model.task],
        "routes": TASK_ROUTES[model.task],
        "labels": list(model.labels) if model.task == "classify" else None,
        "pooling": model.pooling,
        "dimension": model.dimension,
        "max_input_length": model.max_positions,
        "max_client_batch_size": settings.max_inputs,
        "max_inflight_tokens": settings.max_inflight_tokens,
        "normalize": model.normalize,
        "prompts": model.prompts,
        "default_prompt_name": model.default_prompt_name,
        "tokenizer_backend": gateway.preprocessor.tokenizer.backend,
        "device": model.device,
        "model_dtype": model.dtype,
        # Why that dtype: "explicit", or --dtype auto's hardware fact and probe result.
        "dtype_reason": model.dtype_reason,
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
        # Each replica's calibration: replicas that disagree (different cache
        # directories on different hosts) would bucket int8/uint8 differently.
        "replicas": [{"address": r.address, "healthy": r.healthy,
                      "outstanding_tokens": r.outstanding_tokens, "model": gateway.model_id,
                      "calls": r.transport,
                      "calibration_id": (r.info.calibration_id or None) if r.info else None}
                     for r in gateway.pool.replicas],
    }


@router.get("/info", tags=["ops"], summary="The served models and their replicas")
async def info(request: Request, model: str | None = None) -> dict:
    """One model's facts (``?model=NAME``, or the only model); with several, all of them.

    With several models the answer is ``{"models": [...], "replicas": [...],
    "version"}``: each model's own answer, and every replica tagged with
    the model it serves.
    """
    models: ModelRouter = request.app.state.router
    if model is not None:
        return _model_info(models.find(model))
    if len(models.gateways) == 1:
        return _model_info(models.gateways[0])
    answers = [_model_info(g) for g in models.gateways]
    return {"models": answers, "replicas": [r for a in answers for r in a["replicas"]],
            "version": __version__}


@router.get("/v1/models", response_model=ModelList, tags=["OpenAI"], summary="List models")
async def list_models(request: Request) -> dict:
    models: ModelRouter = request.app.state.router
    # Exactly the names a request's ``model`` may use: one entry per name (an
    # alias is an entry of its own, as OpenAI's list has no alias field), each
    # model's canonical name before its aliases.
    by_name = {name: g for g in models.gateways for name in g.served_names}
    return {"object": "list", "data": [{"id": name, "object": "model", "created": 0,
                                        "owned_by": "embedserve", "task": by_name[name].task,
                                        "outputs": TASK_OUTPUTS[by_name[name].task]}
                                       for name in models.served_names]}


@router.get("/metrics", tags=["ops"], summary="Prometheus metrics", response_class=PlainTextResponse)
async def metrics(request: Request) -> Response:
    models: ModelRouter = request.app.state.router
    gateway_metrics = models.gateways[0].metrics
    for gateway in models.gateways:
        gateway_metrics.replicas_healthy.labels(gateway.model_id).set(len(gateway.pool.healthy()))
        gateway_metrics.replicas_known.labels(gateway.model_id).set(len(gateway.pool.replicas))
    text = gateway_metrics.render()
    replicas = models.gateways[0].settings.replica_metrics_urls
    if replicas:   # embedserve serve's local replicas: their scheduler and engine metrics too
        from embedserve.gateway import replica_metrics  # httpx: only where it is used

        text += await replica_metrics.scrape(replicas)
    return Response(text, media_type=CONTENT_TYPE_LATEST)
