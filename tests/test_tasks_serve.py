"""Classification, sparse (SPLADE), LLM-reranker and multi-vector models through ``embedserve serve``.

One server holds a BERT classifier (four labels, single-label softmax), a SPLADE
model (``BertForMaskedLM`` + max pooling), a Qwen3-Reranker-shaped causal LM, a
ColBERT-style MultiVectorEncoder folder and a PyLate ColBERT folder; httpx (and the ``openai`` client for
``/v1/embeddings``' sparse answer) call TEI's ``/predict`` and ``/embed_sparse``, vLLM's
``/classify`` (gRPC: tests/test_scheduler_tasks.py). References are
transformers (probabilities within 1e-5) and sentence-transformers' SparseEncoder (the
same nonzero indices, values within 1e-4) and the Qwen3-Reranker model card's code
(scores within 1e-5) and sentence-transformers' MultiVectorEncoder (token vectors of
``/embed_all`` and the public gRPC ``EmbedTokens``, per-token cosine >= 0.99999; MaxSim on
``/rerank`` and ``/v1/rerank`` within 1e-5) and PyLate's algorithm for the PyLate folder
(tests/pylate_reference.py: ``/embed_all`` and MaxSim on ``/rerank``); routing refusals name the model's task.
The public gRPC API's Classify and EmbedSparse are checked on the same server with the
generated stubs, against the same references and the HTTP routes' answers; bad fields are
INVALID_ARGUMENT naming the field.
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

from embedserve.protos import embeddings_pb2, embeddings_pb2_grpc
from embedserve.protos import embeddings_pb2 as pb
from llm_reranker_models import build_llm_reranker, model_card_scores
from pylate_reference import PyLateReference, colbert_scores
from serve_harness import served_with_grpc
from task_models import build_classifier, build_multivector, build_pylate, build_splade
from token_vectors import assert_same_token_vectors

LABELS = ["negative", "neutral", "positive", "mixed"]
TEXTS = ["The Eiffel tower is in Paris.", "Bananas are yellow.", "What is the capital of France?"]
PAIR_SECONDS = ["Where is the tower?", "Fruit.", "Paris."]
PAIR = ("Where is the Eiffel tower?", "The Eiffel tower is in Paris.")
QUERY = "What is the capital of France?"
DOCS = ["Paris is the capital of France.", "Bananas are yellow.", "The Eiffel tower is in Paris, France.", "no"]
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
def reranker_dir(tmp_path_factory) -> Path:
    return build_llm_reranker(tmp_path_factory.mktemp("qwen3_reranker"), "Qwen3ForCausalLM", seed=4)


@pytest.fixture(scope="module")
def colbert_dir(tmp_path_factory, minilm_dir) -> Path:
    # Classic ColBERT query expansion: queries padded with [MASK] to 24 tokens, not attended to.
    return build_multivector(tmp_path_factory.mktemp("colbert") / "colbert", minilm_dir, seed=6,
                             query_expansion={"strategy": "fixed", "attend": False, "length": 24})


@pytest.fixture(scope="module")
def pylate_dir(tmp_path_factory, minilm_dir) -> Path:
    # PyLate's layout with "[Q] " / "[D] " added to the tokenizer as tokens (GTE-ModernColBERT's).
    return build_pylate(tmp_path_factory.mktemp("pylate") / "pylate", minilm_dir, seed=8, query_prefix="[Q] ",
                        document_prefix="[D] ")


@pytest.fixture(scope="module")
def stack(classifier_dir, splade_dir, reranker_dir, colbert_dir, pylate_dir):
    with served_with_grpc("--model", f"{classifier_dir}:name=clf", "--model", f"{splade_dir}:name=splade",
                          "--model", f"{reranker_dir}:name=qwen3-reranker",
                          "--model", f"{colbert_dir}:name=colbert",
                          "--model", f"{pylate_dir}:name=pylate-colbert") as (url, address):
        yield url, address


@pytest.fixture(scope="module")
def url(stack) -> str:
    return stack[0]


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


def test_inference_client_text_classification(url: str, classifier_dir: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """huggingface_hub's InferenceClient posts {"inputs", "parameters"} to TEI's POST / and
    reads answer[0]: the classifier is the only served model that takes plain inputs."""
    from huggingface_hub import InferenceClient, constants

    # conftest's HF_HUB_OFFLINE would make the client refuse even a local URL.
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    client = InferenceClient(base_url=url, timeout=TIMEOUT_S)
    answer = client.text_classification(TEXTS[1])
    expected = _reference_probabilities(classifier_dir, TEXTS[1])
    got = {item.label: item.score for item in answer}
    np.testing.assert_allclose([got[label] for label in LABELS], expected, atol=1e-5)
    assert [item.score for item in answer] == sorted(got.values(), reverse=True)
    top = client.text_classification(TEXTS[1], top_k=2)
    assert [item.label for item in top] == [item.label for item in answer[:2]]


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
    embedded = httpx.post(f"{url}/embed", json={"inputs": "a"}, timeout=TIMEOUT_S)
    assert embedded.status_code == 400 and "none is served here" in embedded.json()["error"]["message"]
    instructed = httpx.post(f"{url}/rerank", json={"query": "q", "texts": ["a"], "instruction": "x",
                                                    "model": "clf"}, timeout=TIMEOUT_S)
    assert instructed.status_code == 400 and "task `classify`" in instructed.json()["error"]["message"]
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


def test_llm_reranker_answers_the_model_card_scores(url: str, reranker_dir: Path) -> None:
    """Qwen3-Reranker (a causal LM) on /rerank and /v1/rerank against the model card's code."""
    expected = np.array(model_card_scores(reranker_dir, QUERY, DOCS))
    instructed = np.array(model_card_scores(reranker_dir, QUERY, DOCS, instruction="Find the capital"))
    # Named: the multi-vector model answers these routes too (by MaxSim).
    model = "qwen3-reranker"
    tei = httpx.post(f"{url}/rerank", json={"query": QUERY, "texts": DOCS, "model": model}, timeout=TIMEOUT_S)
    cohere = httpx.post(f"{url}/v1/rerank", json={"query": QUERY, "documents": DOCS, "top_n": 2,
                                                  "model": model}, timeout=TIMEOUT_S)
    own = httpx.post(f"{url}/rerank", json={"query": QUERY, "texts": DOCS, "model": model,
                                             "instruction": "Find the capital"}, timeout=TIMEOUT_S)
    raw = httpx.post(f"{url}/rerank", json={"query": QUERY, "texts": DOCS, "raw_scores": True,
                                            "model": model}, timeout=TIMEOUT_S)
    assert tei.status_code == 200, tei.text
    ranked = tei.json()
    assert [r["index"] for r in ranked] == np.argsort(-expected, kind="stable").tolist()
    np.testing.assert_allclose([r["score"] for r in sorted(ranked, key=lambda r: r["index"])], expected,
                               atol=1e-5, rtol=0)
    results = cohere.json()["results"]
    assert [r["index"] for r in results] == np.argsort(-expected, kind="stable")[:2].tolist()
    np.testing.assert_allclose([r["relevance_score"] for r in results],
                               np.sort(expected)[::-1][:2], atol=1e-5, rtol=0)
    np.testing.assert_allclose([r["score"] for r in sorted(own.json(), key=lambda r: r["index"])],
                               instructed, atol=1e-5, rtol=0)
    logits = np.array([r["score"] for r in sorted(raw.json(), key=lambda r: r["index"])])
    np.testing.assert_allclose(1 / (1 + np.exp(-logits)), expected, atol=1e-5, rtol=0)   # logit(yes) - logit(no)


@pytest.fixture(scope="module")
def colbert_reference(colbert_dir: Path):
    from sentence_transformers import MultiVectorEncoder

    model = MultiVectorEncoder(str(colbert_dir), device="cpu")
    return (model, [e.numpy() for e in model.encode_query([QUERY])],
            [e.numpy() for e in model.encode_document(DOCS)])


def test_multivector_embed_all_and_maxsim_rerank(url: str, colbert_reference) -> None:
    """/embed_all (TEI's shape: per input, a list of token vectors) for documents and
    queries, and MaxSim on /rerank and /v1/rerank, against MultiVectorEncoder."""
    model, queries, documents = colbert_reference
    docs = httpx.post(f"{url}/embed_all", json={"model": "colbert", "inputs": DOCS}, timeout=TIMEOUT_S)
    assert docs.status_code == 200, docs.text
    assert_same_token_vectors(docs.json(), documents)
    query = httpx.post(f"{url}/embed_all", json={"model": "colbert", "inputs": QUERY, "input_type": "query"},
                       timeout=TIMEOUT_S)
    assert_same_token_vectors(query.json(), queries)
    assert len(query.json()[0]) == 24   # the query expansion's length: [MASK] positions scored too
    expected = model.similarity(queries, documents).numpy()[0]
    tei = httpx.post(f"{url}/rerank", json={"model": "colbert", "query": QUERY, "texts": DOCS},
                     timeout=TIMEOUT_S).json()
    assert [r["index"] for r in tei] == np.argsort(-expected, kind="stable").tolist()
    np.testing.assert_allclose([r["score"] for r in sorted(tei, key=lambda r: r["index"])], expected,
                               rtol=1e-5, atol=1e-5)
    cohere = httpx.post(f"{url}/v1/rerank", json={"model": "colbert", "query": QUERY, "documents": DOCS,
                                                  "top_n": 2}, timeout=TIMEOUT_S).json()
    np.testing.assert_allclose([r["relevance_score"] for r in cohere["results"]], np.sort(expected)[::-1][:2],
                               rtol=1e-5, atol=1e-5)
    v2 = httpx.post(f"{url}/v2/rerank", json={"model": "colbert", "query": QUERY, "documents": DOCS},
                    timeout=TIMEOUT_S).json()
    np.testing.assert_allclose([r["relevance_score"] for r in v2["results"]], np.sort(expected)[::-1],
                               rtol=1e-5, atol=1e-5)


def test_pylate_folder_embed_all_and_maxsim_rerank_equal_pylate(url: str, pylate_dir: Path) -> None:
    """A PyLate ColBERT folder (markers inserted by id, queries [MASK]-expanded to 12 tokens,
    documents capped at 20 and without punctuation): /embed_all against PyLate's encode and
    /rerank against pylate.scores.colbert_scores (tests/pylate_reference.py)."""
    reference = PyLateReference(pylate_dir)
    queries = [QUERY, "a query much longer than the twelve tokens this model's queries are cut at"]
    documents = [*DOCS, "The Eiffel tower, in Paris, is 330 m tall; it was built for the 1889 World's Fair."]
    expected_documents = reference.encode(documents, is_query=False)
    docs = httpx.post(f"{url}/embed_all", json={"model": "pylate-colbert", "inputs": documents, "truncate": True},
                      timeout=TIMEOUT_S)
    assert docs.status_code == 200, docs.text
    assert_same_token_vectors(docs.json(), expected_documents, labels=documents)
    query = httpx.post(f"{url}/embed_all", json={"model": "pylate-colbert", "inputs": queries, "truncate": True,
                                                 "input_type": "query"}, timeout=TIMEOUT_S)
    assert query.status_code == 200, query.text
    expected_queries = reference.encode(queries, is_query=True)
    assert_same_token_vectors(query.json(), expected_queries, labels=queries)
    assert [len(q) for q in query.json()] == [12, 12] and len(docs.json()[-1]) < 20
    ranked = httpx.post(f"{url}/rerank", json={"model": "pylate-colbert", "query": QUERY, "texts": documents,
                                               "truncate": True}, timeout=TIMEOUT_S)
    assert ranked.status_code == 200, ranked.text
    scores = {item["index"]: item["score"] for item in ranked.json()}
    np.testing.assert_allclose([scores[i] for i in range(len(documents))],
                               colbert_scores(expected_queries[:1], expected_documents)[0], rtol=1e-5, atol=1e-5)


def test_multivector_query_longer_than_the_expansion_length(url: str, colbert_reference) -> None:
    """A fixed expansion caps queries at its length: over it, a 413 unless truncate is
    asked; truncated, the query's vectors equal MultiVectorEncoder's (which cuts it)."""
    model = colbert_reference[0]
    long_query = " ".join(["paris"] * 40)
    refused = httpx.post(f"{url}/embed_all", json={"model": "colbert", "inputs": long_query, "input_type": "query"},
                         timeout=TIMEOUT_S)
    assert refused.status_code == 413, refused.text
    cut = httpx.post(f"{url}/embed_all", json={"model": "colbert", "inputs": long_query, "input_type": "query",
                                               "truncate": True}, timeout=TIMEOUT_S)
    assert cut.status_code == 200, cut.text
    assert_same_token_vectors(cut.json(), [e.numpy() for e in model.encode_query([long_query])])
    assert len(cut.json()[0]) == 24


def test_multivector_routes_refuse_and_info_says_the_output_kind(url: str) -> None:
    as_embedder = httpx.post(f"{url}/embed", json={"model": "colbert", "inputs": "x"}, timeout=TIMEOUT_S)
    assert as_embedder.status_code == 400 and "task `multivector`" in as_embedder.json()["error"]["message"]
    as_classifier = httpx.post(f"{url}/predict", json={"model": "colbert", "inputs": "x"}, timeout=TIMEOUT_S)
    assert as_classifier.status_code == 400 and "task `multivector`" in as_classifier.json()["error"]["message"]
    classifier_tokens = httpx.post(f"{url}/embed_all", json={"model": "clf", "inputs": "x"}, timeout=TIMEOUT_S)
    assert classifier_tokens.status_code == 400
    assert classifier_tokens.json()["error"]["message"].startswith(
        "this route needs an embedding or multi-vector (ColBERT) model; the model `clf` is a sequence classifier "
        "(task `classify`) and cannot return token vectors")
    chunked = httpx.post(f"{url}/embed_all", json={"model": "colbert", "inputs": "x", "truncate": "chunk"},
                         timeout=TIMEOUT_S)
    assert chunked.status_code == 400
    info = {m["model_id"]: m for m in httpx.get(f"{url}/info", timeout=10).json()["models"]}["colbert"]
    assert (info["task"], info["model_type"], info["outputs"], info["dimension"]) == \
        ("multivector", "multi_vector", ["token_vectors", "maxsim_score"], 16)
    models = {m["id"]: m for m in httpx.get(f"{url}/v1/models", timeout=10).json()["data"]}
    assert (models["colbert"]["task"], models["colbert"]["outputs"]) == \
        ("multivector", ["token_vectors", "maxsim_score"])


def test_multivector_over_the_public_grpc_api(stack, colbert_reference) -> None:
    _, address = stack
    _, queries, documents = colbert_reference
    with grpc.insecure_channel(address) as channel:
        stub = embeddings_pb2_grpc.EmbeddingsStub(channel)
        reply = stub.EmbedTokens(embeddings_pb2.EmbedTokensTextRequest(inputs=DOCS, model="colbert"),
                                 timeout=TIMEOUT_S)
        asked = stub.EmbedTokens(embeddings_pb2.EmbedTokensTextRequest(
            inputs=[QUERY], model="colbert", input_type=embeddings_pb2.INPUT_TYPE_QUERY), timeout=TIMEOUT_S)
        with pytest.raises(grpc.RpcError) as refused:
            stub.EmbedTokens(embeddings_pb2.EmbedTokensTextRequest(inputs=["x"], model="clf"), timeout=TIMEOUT_S)
    assert reply.dimension == 16 and reply.model == "colbert"
    assert_same_token_vectors([np.array(r.values).reshape(r.rows, reply.dimension) for r in reply.inputs],
                               documents)
    assert_same_token_vectors([np.array(r.values).reshape(r.rows, asked.dimension) for r in asked.inputs],
                               queries)
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "task `classify`" in refused.value.details()


# -- the public gRPC API's Classify and EmbedSparse ----------------------------


@pytest.fixture(scope="module")
def public_api(stack) -> Iterator[tuple[str, embeddings_pb2_grpc.EmbeddingsStub]]:
    url, address = stack
    with grpc.insecure_channel(address) as channel:
        yield url, embeddings_pb2_grpc.EmbeddingsStub(channel)


def _reference_probabilities_of(model_dir: Path, firsts: list[str], seconds: list[str] | None) -> np.ndarray:
    import transformers

    tokenizer = transformers.AutoTokenizer.from_pretrained(model_dir)
    model = transformers.AutoModelForSequenceClassification.from_pretrained(model_dir).eval()
    rows = []
    with torch.no_grad():
        for i, first in enumerate(firsts):
            encoded = tokenizer(first, seconds[i] if seconds else None, return_tensors="pt")
            rows.append(model(**encoded).logits[0].softmax(-1).numpy())
    return np.array(rows)


def _by_label_scores(scores) -> np.ndarray:
    named = {s.label: s.score for s in scores}
    return np.array([named[label] for label in LABELS])


@pytest.mark.parametrize("pairs", [False, True], ids=["texts", "pairs"])
def test_classify_equals_transformers_and_predict(public_api, classifier_dir, pairs):
    url, stub = public_api
    reply = stub.Classify(pb.ClassifyTextsRequest(inputs=TEXTS, text_pairs=PAIR_SECONDS if pairs else [], model="clf"),
                          timeout=TIMEOUT_S)
    assert reply.model == "clf" and len(reply.results) == len(TEXTS) and reply.usage.prompt_tokens > 0
    expected = _reference_probabilities_of(classifier_dir, TEXTS, PAIR_SECONDS if pairs else None)
    for result, row in zip(reply.results, expected, strict=True):
        scores = [s.score for s in result.scores]
        assert scores == sorted(scores, reverse=True)
        np.testing.assert_allclose(_by_label_scores(result.scores), row, atol=1e-5, rtol=0)
    inputs = [[a, b] for a, b in zip(TEXTS, PAIR_SECONDS, strict=True)] if pairs else [[t] for t in TEXTS]
    http = httpx.post(f"{url}/predict", json={"inputs": inputs, "model": "clf"}, timeout=TIMEOUT_S).json()
    assert [[(s.label, s.score) for s in r.scores] for r in reply.results] == \
        [[(p["label"], pytest.approx(p["score"], abs=1e-7)) for p in row] for row in http]


def test_classify_raw_scores_are_the_logits(public_api, classifier_dir):
    import transformers

    _, stub = public_api
    reply = stub.Classify(pb.ClassifyTextsRequest(inputs=TEXTS[:1], model="clf", raw_scores=True),
                          timeout=TIMEOUT_S)
    tokenizer = transformers.AutoTokenizer.from_pretrained(classifier_dir)
    model = transformers.AutoModelForSequenceClassification.from_pretrained(classifier_dir).eval()
    with torch.no_grad():
        logits = model(**tokenizer(TEXTS[0], return_tensors="pt")).logits[0].numpy()
    np.testing.assert_allclose(_by_label_scores(reply.results[0].scores), logits, atol=1e-5, rtol=0)


def test_embed_sparse_equals_sparse_encoder_and_embed_sparse(public_api, sparse_reference):
    url, stub = public_api
    reply = stub.EmbedSparse(pb.EmbedSparseTextsRequest(inputs=TEXTS, model="splade"), timeout=TIMEOUT_S)
    assert reply.model == "splade" and reply.usage.prompt_tokens > 0
    for embedding, expected in zip(reply.embeddings, sparse_reference, strict=True):
        np.testing.assert_array_equal(list(embedding.indices), np.flatnonzero(expected))
        np.testing.assert_allclose(list(embedding.values), expected[list(embedding.indices)], atol=1e-4, rtol=0)
    http = httpx.post(f"{url}/embed_sparse", json={"inputs": TEXTS, "model": "splade"}, timeout=TIMEOUT_S).json()
    assert [list(e.indices) for e in reply.embeddings] == [[v["index"] for v in row] for row in http]
    np.testing.assert_allclose(np.concatenate([list(e.values) for e in reply.embeddings]),
                               [v["value"] for row in http for v in row], rtol=1e-6)


def test_embed_sparse_top_k_keeps_the_largest_weights(public_api, sparse_reference):
    _, stub = public_api
    reply = stub.EmbedSparse(pb.EmbedSparseTextsRequest(inputs=TEXTS, model="splade", top_k=5), timeout=TIMEOUT_S)
    for embedding, expected in zip(reply.embeddings, sparse_reference, strict=True):
        largest = np.sort(np.argsort(-expected, kind="stable")[:5])
        np.testing.assert_array_equal(list(embedding.indices), largest)


def _bad_field(error: grpc.RpcError) -> str:
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
    ("Classify", pb.ClassifyTextsRequest(inputs=TEXTS, text_pairs=PAIR_SECONDS[:1], model="clf"), "text_pairs"),
    ("EmbedSparse", pb.EmbedSparseTextsRequest(inputs=TEXTS, model="splade", top_k=0), "top_k"),
    ("EmbedSparse", pb.EmbedSparseTextsRequest(inputs=TEXTS, model="splade", truncate="chunk"), "truncate"),
    ("EmbedSparse", pb.EmbedSparseTextsRequest(inputs=["x " * 1000], model="splade"), "inputs[0]"),
])
def test_bad_fields_are_invalid_argument_naming_the_field(public_api, call, request_, field):
    _, stub = public_api
    with pytest.raises(grpc.RpcError) as caught:
        getattr(stub, call)(request_, timeout=TIMEOUT_S)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT, caught.value.details()
    assert _bad_field(caught.value) == field


@pytest.mark.parametrize("call, request_, task", [
    ("Classify", pb.ClassifyTextsRequest(inputs=TEXTS, model="splade"), "sparse"),
    ("EmbedSparse", pb.EmbedSparseTextsRequest(inputs=TEXTS, model="clf"), "classify"),
])
def test_a_model_of_another_task_is_refused_naming_its_task(public_api, call, request_, task):
    _, stub = public_api
    with pytest.raises(grpc.RpcError) as caught:
        getattr(stub, call)(request_, timeout=TIMEOUT_S)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT, caught.value.details()
    assert task in caught.value.details()
