"""The public gRPC API's Classify and EmbedSparse on a real ``embedserve serve --grpc-port 0``.

One stack for the module: a tiny BERT classifier (three labels, single-label softmax) and
a tiny SPLADE model (``BertForMaskedLM`` + max pooling). Checked with the generated stubs
against the references (transformers' probabilities within 1e-5, sentence-transformers'
SparseEncoder: the same nonzero indices, values within 1e-4) and against the HTTP routes
(``/predict`` and ``/embed_sparse``) for the same inputs; bad fields are INVALID_ARGUMENT
naming the field, a model of another task a clear refusal.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import grpc
import httpx
import numpy as np
import pytest
import torch
from google.rpc import error_details_pb2
from grpc_status import rpc_status

from embedserve.protos import embeddings_pb2 as pb
from embedserve.protos import embeddings_pb2_grpc
from serve_harness import served_with_grpc
from task_models import build_classifier, build_splade

LABELS = ["negative", "neutral", "positive"]
TEXTS = ["The Eiffel tower is in Paris.", "Bananas are yellow.", "What is the capital of France?"]
SECOND = ["Where is the tower?", "Fruit.", "Paris."]
TIMEOUT_S = 300


@pytest.fixture(scope="module")
def classifier_dir(tmp_path_factory, minilm_dir) -> Path:
    return build_classifier(tmp_path_factory.mktemp("grpc_classifier"), "BertForSequenceClassification",
                            LABELS, "single_label_classification", minilm_dir, seed=6)


@pytest.fixture(scope="module")
def splade_dir(tmp_path_factory, minilm_dir) -> Path:
    return build_splade(tmp_path_factory.mktemp("grpc_splade"), minilm_dir, seed=7)


@pytest.fixture(scope="module")
def stack(classifier_dir, splade_dir) -> Iterator[tuple[str, embeddings_pb2_grpc.EmbeddingsStub]]:
    with served_with_grpc("--model", f"{classifier_dir}:name=clf",
                          "--model", f"{splade_dir}:name=splade") as (url, address):
        with grpc.insecure_channel(address) as channel:
            yield url, embeddings_pb2_grpc.EmbeddingsStub(channel)


def reference_probabilities(model_dir: Path, firsts: list[str], seconds: list[str] | None) -> np.ndarray:
    import transformers

    tokenizer = transformers.AutoTokenizer.from_pretrained(model_dir)
    model = transformers.AutoModelForSequenceClassification.from_pretrained(model_dir).eval()
    rows = []
    with torch.no_grad():
        for i, first in enumerate(firsts):
            encoded = tokenizer(first, seconds[i] if seconds else None, return_tensors="pt")
            rows.append(model(**encoded).logits[0].softmax(-1).numpy())
    return np.array(rows)


def by_label(scores) -> np.ndarray:
    named = {s.label: s.score for s in scores}
    return np.array([named[label] for label in LABELS])


@pytest.mark.parametrize("pairs", [False, True], ids=["texts", "pairs"])
def test_classify_equals_transformers_and_predict(stack, classifier_dir, pairs):
    url, stub = stack
    reply = stub.Classify(pb.ClassifyTextsRequest(inputs=TEXTS, text_pairs=SECOND if pairs else [], model="clf"),
                          timeout=TIMEOUT_S)
    assert reply.model == "clf" and len(reply.results) == len(TEXTS) and reply.usage.prompt_tokens > 0
    expected = reference_probabilities(classifier_dir, TEXTS, SECOND if pairs else None)
    for result, row in zip(reply.results, expected, strict=True):
        scores = [s.score for s in result.scores]
        assert scores == sorted(scores, reverse=True)
        np.testing.assert_allclose(by_label(result.scores), row, atol=1e-5, rtol=0)
    inputs = [[a, b] for a, b in zip(TEXTS, SECOND, strict=True)] if pairs else [[t] for t in TEXTS]
    http = httpx.post(f"{url}/predict", json={"inputs": inputs, "model": "clf"}, timeout=TIMEOUT_S).json()
    assert [[(s.label, s.score) for s in r.scores] for r in reply.results] == \
        [[(p["label"], pytest.approx(p["score"], abs=1e-7)) for p in row] for row in http]


def test_classify_raw_scores_are_the_logits(stack, classifier_dir):
    import transformers

    _, stub = stack
    reply = stub.Classify(pb.ClassifyTextsRequest(inputs=TEXTS[:1], model="clf", raw_scores=True),
                          timeout=TIMEOUT_S)
    tokenizer = transformers.AutoTokenizer.from_pretrained(classifier_dir)
    model = transformers.AutoModelForSequenceClassification.from_pretrained(classifier_dir).eval()
    with torch.no_grad():
        logits = model(**tokenizer(TEXTS[0], return_tensors="pt")).logits[0].numpy()
    np.testing.assert_allclose(by_label(reply.results[0].scores), logits, atol=1e-5, rtol=0)


@pytest.fixture(scope="module")
def sparse_reference(splade_dir: Path) -> np.ndarray:
    from sentence_transformers import SparseEncoder

    return SparseEncoder(str(splade_dir), device="cpu").encode(
        TEXTS, convert_to_tensor=True, convert_to_sparse_tensor=False).numpy()


def test_embed_sparse_equals_sparse_encoder_and_embed_sparse(stack, sparse_reference):
    url, stub = stack
    reply = stub.EmbedSparse(pb.EmbedSparseTextsRequest(inputs=TEXTS, model="splade"), timeout=TIMEOUT_S)
    assert reply.model == "splade" and reply.usage.prompt_tokens > 0
    for embedding, expected in zip(reply.embeddings, sparse_reference, strict=True):
        np.testing.assert_array_equal(list(embedding.indices), np.flatnonzero(expected))
        np.testing.assert_allclose(list(embedding.values), expected[list(embedding.indices)], atol=1e-4, rtol=0)
    http = httpx.post(f"{url}/embed_sparse", json={"inputs": TEXTS, "model": "splade"}, timeout=TIMEOUT_S).json()
    assert [list(e.indices) for e in reply.embeddings] == [[v["index"] for v in row] for row in http]
    np.testing.assert_allclose(np.concatenate([list(e.values) for e in reply.embeddings]),
                               [v["value"] for row in http for v in row], rtol=1e-6)


def test_embed_sparse_top_k_keeps_the_largest_weights(stack, sparse_reference):
    _, stub = stack
    reply = stub.EmbedSparse(pb.EmbedSparseTextsRequest(inputs=TEXTS, model="splade", top_k=5), timeout=TIMEOUT_S)
    for embedding, expected in zip(reply.embeddings, sparse_reference, strict=True):
        largest = np.sort(np.argsort(-expected, kind="stable")[:5])
        np.testing.assert_array_equal(list(embedding.indices), largest)


def bad_field(error: grpc.RpcError) -> str:
    """The field the status's google.rpc.BadRequest detail names."""
    status = rpc_status.from_call(error)
    assert status is not None, "no google.rpc.Status details"
    for detail in status.details:
        if detail.Is(error_details_pb2.BadRequest.DESCRIPTOR):
            bad_request = error_details_pb2.BadRequest()
            detail.Unpack(bad_request)
            return bad_request.field_violations[0].field
    raise AssertionError("no BadRequest detail")


@pytest.mark.parametrize("call, request_, field", [
    ("Classify", pb.ClassifyTextsRequest(inputs=[], model="clf"), "inputs"),
    ("Classify", pb.ClassifyTextsRequest(inputs=TEXTS, text_pairs=SECOND[:1], model="clf"), "text_pairs"),
    ("EmbedSparse", pb.EmbedSparseTextsRequest(inputs=TEXTS, model="splade", top_k=0), "top_k"),
    ("EmbedSparse", pb.EmbedSparseTextsRequest(inputs=TEXTS, model="splade", truncate="chunk"), "truncate"),
    ("EmbedSparse", pb.EmbedSparseTextsRequest(inputs=["x " * 1000], model="splade"), "inputs[0]"),
])
def test_bad_fields_are_invalid_argument_naming_the_field(stack, call, request_, field):
    _, stub = stack
    with pytest.raises(grpc.RpcError) as caught:
        getattr(stub, call)(request_, timeout=TIMEOUT_S)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT, caught.value.details()
    assert bad_field(caught.value) == field


@pytest.mark.parametrize("call, request_, task", [
    ("Classify", pb.ClassifyTextsRequest(inputs=TEXTS, model="splade"), "sparse"),
    ("EmbedSparse", pb.EmbedSparseTextsRequest(inputs=TEXTS, model="clf"), "classify"),
])
def test_a_model_of_another_task_is_refused_naming_its_task(stack, call, request_, task):
    _, stub = stack
    with pytest.raises(grpc.RpcError) as caught:
        getattr(stub, call)(request_, timeout=TIMEOUT_S)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT, caught.value.details()
    assert task in caught.value.details()
