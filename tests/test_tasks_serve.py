"""Classification and sparse (SPLADE) models through ``embedserve serve``, with real clients.

One server holds a BERT classifier (four labels, single-label softmax) and a SPLADE
model (``BertForMaskedLM`` + max pooling); httpx (and the ``openai`` client for
``/v1/embeddings``' sparse answer) call TEI's ``/predict`` and ``/embed_sparse``, vLLM's
``/classify`` (gRPC: tests/test_scheduler_tasks.py). References are
transformers (probabilities within 1e-5) and sentence-transformers' SparseEncoder (the
same nonzero indices, values within 1e-4); routing refusals name the model's task.
"""

from __future__ import annotations

from pathlib import Path

import httpx
import numpy as np
import pytest
import torch

from serve_harness import served
from task_models import build_classifier, build_splade

LABELS = ["negative", "neutral", "positive", "mixed"]
TEXTS = ["The Eiffel tower is in Paris.", "Bananas are yellow.", "What is the capital of France?"]
PAIR = ("Where is the Eiffel tower?", "The Eiffel tower is in Paris.")
# A first request may wait for a tokenizer kernel's compile (tests/kernel_warmup.py).
TIMEOUT_S = 180


@pytest.fixture(scope="module")
def classifier_dir(tmp_path_factory, minilm_dir) -> Path:
    return build_classifier(tmp_path_factory.mktemp("classifier"), "BertForSequenceClassification",
                            LABELS, "single_label_classification", minilm_dir, seed=3)


@pytest.fixture(scope="module")
def splade_dir(tmp_path_factory, minilm_dir) -> Path:
    return build_splade(tmp_path_factory.mktemp("splade"), minilm_dir, seed=5)


@pytest.fixture(scope="module")
def url(classifier_dir, splade_dir):
    with served("--model", f"{classifier_dir}:name=clf", "--model", f"{splade_dir}:name=splade") as url:
        yield url


def _reference_probabilities(model_dir: Path, first: str, second: str | None = None) -> np.ndarray:
    import transformers

    tokenizer = transformers.AutoTokenizer.from_pretrained(model_dir)
    model = transformers.AutoModelForSequenceClassification.from_pretrained(model_dir).eval()
    encoded = tokenizer(first, second, return_tensors="pt")
    with torch.no_grad():
        return model(**encoded).logits[0].softmax(-1).numpy()


def _by_label(predictions: list[dict]) -> np.ndarray:
    scores = {p["label"]: p["score"] for p in predictions}
    return np.array([scores[label] for label in LABELS])


def test_predict_single_pair_and_batch(url: str, classifier_dir: Path) -> None:
    single = httpx.post(f"{url}/predict", json={"inputs": TEXTS[0], "model": "clf"}, timeout=TIMEOUT_S)
    assert single.status_code == 200, single.text
    answer = single.json()
    assert [p["score"] for p in answer] == sorted((p["score"] for p in answer), reverse=True)
    np.testing.assert_allclose(_by_label(answer), _reference_probabilities(classifier_dir, TEXTS[0]),
                               atol=1e-5, rtol=0)
    pair = httpx.post(f"{url}/predict", json={"inputs": list(PAIR), "model": "clf"}, timeout=TIMEOUT_S).json()
    np.testing.assert_allclose(_by_label(pair), _reference_probabilities(classifier_dir, *PAIR),
                               atol=1e-5, rtol=0)
    batch = httpx.post(f"{url}/predict", json={"inputs": [[TEXTS[1]], list(PAIR), [TEXTS[2]]],
                                                "model": "clf"}, timeout=TIMEOUT_S).json()
    assert len(batch) == 3 and all(len(item) == len(LABELS) for item in batch)
    for item, (first, second) in zip(batch, [(TEXTS[1], None), PAIR, (TEXTS[2], None)]):
        np.testing.assert_allclose(_by_label(item), _reference_probabilities(classifier_dir, first, second),
                                   atol=1e-5, rtol=0)


def test_predict_raw_scores_are_the_logits(url: str, classifier_dir: Path) -> None:
    import transformers

    tokenizer = transformers.AutoTokenizer.from_pretrained(classifier_dir)
    model = transformers.AutoModelForSequenceClassification.from_pretrained(classifier_dir).eval()
    with torch.no_grad():
        logits = model(**tokenizer(TEXTS[1], return_tensors="pt")).logits[0].numpy()
    raw = httpx.post(f"{url}/predict", json={"inputs": TEXTS[1], "raw_scores": True, "model": "clf"},
                     timeout=TIMEOUT_S).json()
    np.testing.assert_allclose(_by_label(raw), logits, atol=1e-5, rtol=0)


def test_classify_in_vllm_shape(url: str, classifier_dir: Path) -> None:
    reply = httpx.post(f"{url}/classify", json={"model": "clf", "input": TEXTS}, timeout=TIMEOUT_S)
    assert reply.status_code == 200, reply.text
    body = reply.json()
    assert body["object"] == "list" and body["model"] == "clf" and body["id"].startswith("classify-")
    assert body["usage"]["prompt_tokens"] > 0
    for i, item in enumerate(body["data"]):
        expected = _reference_probabilities(classifier_dir, TEXTS[i])
        assert item["index"] == i and item["num_classes"] == len(LABELS)
        np.testing.assert_allclose(item["probs"], expected, atol=1e-5, rtol=0)
        assert item["label"] == LABELS[int(np.argmax(expected))]


@pytest.fixture(scope="module")
def sparse_reference(splade_dir: Path) -> np.ndarray:
    from sentence_transformers import SparseEncoder

    return SparseEncoder(str(splade_dir), device="cpu").encode(
        TEXTS, convert_to_tensor=True, convert_to_sparse_tensor=False).numpy()


def test_embed_sparse_equals_sparse_encoder(url: str, sparse_reference: np.ndarray) -> None:
    reply = httpx.post(f"{url}/embed_sparse", json={"inputs": TEXTS, "model": "splade"}, timeout=TIMEOUT_S)
    assert reply.status_code == 200, reply.text
    for row, expected in zip(reply.json(), sparse_reference):
        indices = [entry["index"] for entry in row]
        np.testing.assert_array_equal(indices, np.flatnonzero(expected))
        np.testing.assert_allclose([entry["value"] for entry in row], expected[indices], atol=1e-4, rtol=0)


def test_openai_client_sparse_option_and_top_k(url: str, sparse_reference: np.ndarray) -> None:
    import openai

    client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused")
    answer = client.embeddings.create(model="splade", input=TEXTS, extra_body={"sparse": True, "top_k": 5})
    for item, expected in zip(answer.data, sparse_reference):
        embedding = item.embedding
        top = np.sort(np.argsort(-expected, kind="stable")[:5])
        assert embedding["indices"] == top.tolist()
        np.testing.assert_allclose(embedding["values"], expected[top], atol=1e-4, rtol=0)


def test_each_model_answers_only_its_routes(url: str) -> None:
    sparse_as_dense = httpx.post(f"{url}/v1/embeddings", json={"model": "splade", "input": "x"}, timeout=TIMEOUT_S)
    assert sparse_as_dense.status_code == 400
    message = sparse_as_dense.json()["error"]["message"]
    assert "task `sparse`" in message and '"sparse": true' in message
    classifier_embeds = httpx.post(f"{url}/embed", json={"model": "clf", "inputs": "x"}, timeout=TIMEOUT_S)
    assert classifier_embeds.status_code == 400
    assert "task `classify`" in classifier_embeds.json()["error"]["message"]
    splade_predicts = httpx.post(f"{url}/predict", json={"model": "splade", "inputs": "x"}, timeout=TIMEOUT_S)
    assert splade_predicts.status_code == 400 and "task `sparse`" in splade_predicts.json()["error"]["message"]
    reranked = httpx.post(f"{url}/rerank", json={"query": "q", "texts": ["a"]}, timeout=TIMEOUT_S)
    assert reranked.status_code == 400 and "none is served here" in reranked.json()["error"]["message"]
    too_many = httpx.post(f"{url}/predict", json={"model": "clf", "inputs": ["a", "b", "c"]}, timeout=TIMEOUT_S)
    assert too_many.status_code == 400 and "inputs has 3 strings" in too_many.json()["error"]["message"]
    chunked = httpx.post(f"{url}/embed_sparse", json={"model": "splade", "inputs": "x", "truncate": "chunk"},
                         timeout=TIMEOUT_S)
    assert chunked.status_code == 400


def test_info_and_models_say_each_task(url: str) -> None:
    info = {m["model_id"]: m for m in httpx.get(f"{url}/info", timeout=10).json()["models"]}
    assert (info["clf"]["task"], info["clf"]["model_type"], info["clf"]["labels"]) == ("classify", "classifier", LABELS)
    assert (info["splade"]["task"], info["splade"]["outputs"], info["splade"]["dimension"]) == \
        ("sparse", ["sparse_vector"], 30522)
    models = {m["id"]: m for m in httpx.get(f"{url}/v1/models", timeout=10).json()["data"]}
    assert (models["clf"]["task"], models["splade"]["task"]) == ("classify", "sparse")
    metrics = httpx.get(f"{url}/metrics", timeout=10).text
    assert 'embedserve_gateway_model_task{model="splade",task="sparse"} 1.0' in metrics
