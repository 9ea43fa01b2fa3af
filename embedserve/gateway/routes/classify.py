"""Classification routes: TEI ``POST /predict`` and vLLM ``POST /classify``.

Owns both JSON shapes over ``Gateway.classify``: TEI answers a list of
``{score, label}`` sorted by score (highest first) per input, a bare list for
one input and a list of lists for a batch, probabilities unless ``raw_scores``;
vLLM answers ``data[i] = {index, label (the most probable), probs, num_classes}``
with usage. Probabilities are the model's: softmax over the labels, or a sigmoid
per label for a ``multi_label_classification`` model (model/tasks.py).
"""

from __future__ import annotations

import secrets
import time

import numpy as np
from fastapi import APIRouter, Request
from fastapi.responses import Response

from embedserve.gateway.classify_inputs import pack_items, predict_items
from embedserve.gateway.pipeline import timed
from embedserve.gateway.priority import request_priority
from embedserve.gateway.routes.embed import json_response
from embedserve.gateway.task_schemas import ClassificationResponse, ClassifyRequest, Prediction, PredictRequest

router = APIRouter()


def predictions(scores: np.ndarray, labels: tuple[str, ...]) -> list[dict]:
    # Highest first; ties keep label order (a stable sort), as TEI's sort does.
    order = np.argsort(-scores, kind="stable")
    return [{"score": float(scores[k]), "label": labels[k]} for k in order]


@router.post("/predict", response_model=list[Prediction] | list[list[Prediction]], tags=["TEI"],
             summary="Classify inputs or pairs (text-embeddings-inference-compatible)")
async def predict(body: PredictRequest, request: Request) -> Response:
    gateway, _ = request.app.state.router.route(body.model, "classify")
    request_priority(request.scope, body.priority, gateway.settings.route_priorities)
    items, batch = predict_items(body.inputs)
    gateway.check_count(len(items), "inputs")
    packed = await timed(request, "tokenize", pack_items(gateway.preprocessor, items, body.truncate,
                                                         body.truncation_direction, "inputs"))
    scores = await gateway.classify(request, packed, body.raw_scores, "/predict")
    labels = gateway.model.labels
    answers = [predictions(row, labels) for row in scores]
    return json_response(answers if batch else answers[0])


@router.post("/classify", response_model=ClassificationResponse, tags=["vLLM"],
             summary="Classify inputs (vLLM-compatible)")
async def classify(body: ClassifyRequest, request: Request) -> Response:
    gateway, model = request.app.state.router.route(body.model, "classify")
    request_priority(request.scope, body.priority, gateway.settings.route_priorities)
    texts = [body.input] if isinstance(body.input, str) else body.input
    gateway.check_count(len(texts), "input")
    truncate = body.truncate_prompt_tokens is not None
    packed = await timed(request, "tokenize", gateway.preprocessor.encode_texts(
        texts, "", truncate, "left", "input"))
    probs = await gateway.classify(request, packed, False, "/classify")
    labels = gateway.model.labels
    data = [{"index": i, "label": labels[int(np.argmax(row))], "probs": row.tolist(),
             "num_classes": len(labels)} for i, row in enumerate(probs)]
    tokens = packed.num_tokens
    return json_response({"id": f"classify-{secrets.token_hex(16)}", "object": "list",
                          "created": int(time.time()), "model": model, "data": data,
                          "usage": {"prompt_tokens": tokens, "total_tokens": tokens,
                                    "completion_tokens": 0, "prompt_tokens_details": None}})
