"""The clients people already have, pointed at ``embedserve serve``: huggingface_hub and cohere.

One stack for the module: a tiny XLM-R embedder (mean pooling + Normalize,
prompts query:/passage:) and a tiny XLM-R cross-encoder behind one gateway
with an API key. ``huggingface_hub.InferenceClient(base_url=URL)`` posts
``feature_extraction`` and ``sentence_similarity`` to TEI's ``POST /``;
``cohere.ClientV2(base_url=URL)`` calls ``/v2/embed`` and ``/v2/rerank``. Every
answer is checked against sentence-transformers on the same directories
(``SentenceTransformer``, ``CrossEncoder``, ``quantize_embeddings``), and every
refusal is checked as the client surfaces it: the status and the message in the
API's own error shape.
"""

from __future__ import annotations

import base64
from pathlib import Path

import httpx
import numpy as np
import pytest

from conftest import TINY_SIZES, build_tiny_model
from serve_harness import served
from st_metadata import write_st_metadata

API_KEY = "test-key-42"
TEXTS = ["The quick brown fox jumps over the lazy dog.", "Une phrase en français.",
         "short", "Ein Satz mit Ümläuten und ß.", "numbers 1 2 3 and symbols #$%"]
SOURCE = "A fox jumps over a dog."
DOCUMENTS = ["The quick brown fox jumps over the lazy dog.", "Stock markets fell sharply today.",
             "Foxes are small omnivorous mammals.", "ok", "A dog sleeps while a fox jumps."]


@pytest.fixture(scope="module")
def embedder_dir(tmp_path_factory: pytest.TempPathFactory, xlmr_tokenizer_dir: Path) -> Path:
    """XLMRobertaModel, mean pooling + Normalize, prompts query:/passage: (like e5), with
    XLM-R's tokenizer files, which sentence-transformers loads as they are."""
    directory = build_tiny_model(tmp_path_factory.mktemp("clients_embedder"), "XLMRobertaModel",
                                 xlmr_tokenizer_dir)
    write_st_metadata(directory, TINY_SIZES["hidden_size"], "mean", True,
                      {"query": "query: ", "passage": "passage: "})
    return directory


@pytest.fixture(scope="module")
def server_url(embedder_dir: Path, tiny_reranker_dir: Path):
    with served("--model", f"{embedder_dir}:name=tiny-embed",
                "--model", f"{tiny_reranker_dir}:name=tiny-rerank",
                "--api-key", API_KEY) as url:
        yield url


@pytest.fixture(scope="module")
def st_model(embedder_dir: Path):
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(str(embedder_dir), device="cpu")


@pytest.fixture(scope="module")
def cross_encoder(tiny_reranker_dir: Path):
    from sentence_transformers import CrossEncoder

    return CrossEncoder(str(tiny_reranker_dir), device="cpu")


def _sigmoid_scores(cross_encoder, query: str, docs: list[str]) -> np.ndarray:
    import torch

    return cross_encoder.predict([(query, d) for d in docs], activation_fn=torch.nn.Sigmoid())


@pytest.fixture(autouse=True)
def hub_client_may_post_locally(monkeypatch: pytest.MonkeyPatch) -> None:
    """conftest sets HF_HUB_OFFLINE so that reference libraries never reach a hub, and
    huggingface_hub then refuses every request, a local URL's too. The InferenceClient
    here only ever posts to the local server (a URL as ``model`` needs no hub look-up)."""
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)


def _hf(url: str, key: str | None = API_KEY):
    from huggingface_hub import InferenceClient

    return InferenceClient(base_url=url, api_key=key, timeout=180)


def _cohere(url: str, key: str = API_KEY):
    import cohere

    return cohere.ClientV2(api_key=key, base_url=url, timeout=180)


def _http(url: str) -> httpx.Client:
    return httpx.Client(base_url=url, timeout=60, headers={"Authorization": f"Bearer {API_KEY}"})


def _assert_same_vectors(got: np.ndarray, expected: np.ndarray) -> None:
    assert got.shape == expected.shape
    cosines = (got * expected).sum(1) / np.linalg.norm(got, axis=1) / np.linalg.norm(expected, axis=1)
    assert cosines.min() >= 0.99999, cosines
    np.testing.assert_allclose(got, expected, atol=1e-5)


# -- huggingface_hub InferenceClient -> POST / --------------------------------

def test_inference_client_feature_extraction_equals_sentence_transformers(server_url, st_model) -> None:
    client = _hf(server_url)
    _assert_same_vectors(client.feature_extraction(TEXTS), st_model.encode(TEXTS))
    # One text is a batch of one, as TEI answers it; a prompt by name, as sentence-transformers applies it.
    one = client.feature_extraction(TEXTS[0], prompt_name="query")
    _assert_same_vectors(one, st_model.encode([TEXTS[0]], prompt_name="query"))
    assert one.dtype == np.float32


def test_inference_client_sentence_similarity_equals_sentence_transformers(server_url, st_model) -> None:
    got = _hf(server_url).sentence_similarity(SOURCE, DOCUMENTS)
    vectors = st_model.encode([SOURCE, *DOCUMENTS])
    expected = st_model.similarity(vectors[:1], vectors[1:])[0].numpy()
    assert st_model.similarity_fn_name == "cosine"
    np.testing.assert_allclose(got, expected, atol=1e-5)
    # TEI's own /similarity route answers the same.
    with _http(server_url) as http:
        reply = http.post("/similarity", json={"inputs": {"source_sentence": SOURCE,
                                                          "sentences": DOCUMENTS}})
    assert reply.status_code == 200, reply.text
    np.testing.assert_allclose(reply.json(), expected, atol=1e-5)


def test_root_answers_a_cross_encoder_as_tei_does(server_url, cross_encoder) -> None:
    """Sentence similarity on a cross-encoder scores each (source, sentence) pair as
    CrossEncoder.predict does; TEI's /rerank body on / reranks."""
    import torch

    with _http(server_url) as http:
        similar = http.post("/", json={"inputs": {"source_sentence": SOURCE, "sentences": DOCUMENTS},
                                       "model": "tiny-rerank"})
        ranked = http.post("/", json={"query": SOURCE, "texts": DOCUMENTS, "raw_scores": True,
                                      "return_text": True})   # the only reranker: no `model` needed
    assert similar.status_code == 200, similar.text
    np.testing.assert_allclose(similar.json(), _sigmoid_scores(cross_encoder, SOURCE, DOCUMENTS), atol=1e-5)
    assert ranked.status_code == 200, ranked.text
    logits = cross_encoder.predict([(SOURCE, d) for d in DOCUMENTS], activation_fn=torch.nn.Identity())
    assert [r["index"] for r in ranked.json()] == list(np.argsort(-logits, kind="stable"))
    np.testing.assert_allclose([r["score"] for r in ranked.json()],
                               logits[[r["index"] for r in ranked.json()]], atol=1e-5)
    assert [r["text"] for r in ranked.json()] == [DOCUMENTS[r["index"]] for r in ranked.json()]


def test_inference_client_errors_are_tei_shaped_4xx(server_url) -> None:
    from huggingface_hub.errors import HfHubHTTPError

    client = _hf(server_url)
    cases = [(lambda: client.feature_extraction(""), 400, "inputs[0] is an empty string"),
             (lambda: client.feature_extraction("x", prompt_name="nope"), 400, "unknown prompt 'nope'"),
             (lambda: client.feature_extraction("x", dimensions=10_000), 400, "dimensions"),
             (lambda: client.feature_extraction("x", encoding_format="base64"), 400, "encoding_format"),
             (lambda: client.sentence_similarity("x", []), 400, "inputs.sentences must not be empty"),
             (lambda: client.feature_extraction("word " * 600, truncate=False), 413, "the model takes at most")]
    for call, status, message in cases:
        with pytest.raises(HfHubHTTPError) as caught:
            call()
        assert caught.value.response.status_code == status, caught.value.response.text
        body = caught.value.response.json()
        assert isinstance(body["error"], str) and message in body["error"], body
        assert message in str(caught.value)
    with _http(server_url) as http:
        wrong_type = http.post("/", json={"inputs": 5})
        malformed = http.post("/", content=b"{not json", headers={"content-type": "application/json"})
        pairs_needed = http.post("/", json={"inputs": "x", "model": "tiny-rerank"})
        similarity_type = http.post("/similarity", json={"inputs": {"source_sentence": "x"}})
    assert wrong_type.status_code == 422 and wrong_type.json()["error_type"] == "validation"
    assert "inputs" in wrong_type.json()["error"]
    assert malformed.status_code == 400 and "malformed JSON" in malformed.json()["error"]
    assert pairs_needed.status_code == 400 and "reranker" in pairs_needed.json()["error"]
    assert similarity_type.status_code == 422 and "sentences" in similarity_type.json()["error"]


# -- cohere ClientV2 -> /v2/embed, /v2/rerank ---------------------------------

def test_cohere_embed_equals_sentence_transformers_and_quantize_embeddings(server_url, st_model) -> None:
    from sentence_transformers.util.quantization import quantize_embeddings

    client = _cohere(server_url)
    reply = client.embed(texts=TEXTS, model="tiny-embed", input_type="search_query",
                         embedding_types=["float", "int8", "ubinary", "base64"])
    floats = np.array(reply.embeddings.float_, dtype=np.float32)
    _assert_same_vectors(floats, st_model.encode(TEXTS, prompt_name="query"))
    assert reply.texts == TEXTS and reply.id and reply.meta.billed_units.input_tokens > 0
    # int8 buckets: the replicas' calibration ranges, as quantize_embeddings applies them.
    with _http(server_url) as http:
        ranges = np.array(http.get("/v1/quantization/ranges", params={"model": "tiny-embed"}).json()["ranges"],
                          dtype=np.float32)
        openai_int8 = http.post("/v1/embeddings", json={"input": TEXTS, "model": "tiny-embed",
                                                        "input_type": "query",
                                                        "embedding_types": ["int8"]}).json()
    int8 = np.array(reply.embeddings.int8)
    np.testing.assert_array_equal(int8, quantize_embeddings(floats, "int8", ranges=ranges))
    np.testing.assert_array_equal(int8, [d["embedding"]["int8"] for d in openai_int8["data"]])
    np.testing.assert_array_equal(reply.embeddings.ubinary, quantize_embeddings(floats, "ubinary"))
    decoded = np.array([np.frombuffer(base64.b64decode(b), dtype="<f4") for b in reply.embeddings.base64])
    np.testing.assert_array_equal(decoded, floats)

    # search_document -> the model's "passage" prompt; output_dimension -> Matryoshka
    # truncation (renormalized: compared by direction); float is the default type.
    docs = client.embed(texts=TEXTS, model="tiny-embed", input_type="search_document", output_dimension=16)
    assert docs.embeddings.int8 is None
    expected = st_model.encode(TEXTS, prompt_name="passage", truncate_dim=16)
    got = np.array(docs.embeddings.float_)
    assert got.shape == (len(TEXTS), 16)
    cosines = (got * expected).sum(1) / np.linalg.norm(got, axis=1) / np.linalg.norm(expected, axis=1)
    assert cosines.min() >= 0.99999, cosines


def test_cohere_rerank_equals_cross_encoder(server_url, cross_encoder) -> None:
    reply = _cohere(server_url).rerank(model="tiny-rerank", query=SOURCE, documents=DOCUMENTS, top_n=3)
    expected = _sigmoid_scores(cross_encoder, SOURCE, DOCUMENTS)
    order = list(np.argsort(-expected, kind="stable"))[:3]
    assert [r.index for r in reply.results] == order
    np.testing.assert_allclose([r.relevance_score for r in reply.results], expected[order], atol=1e-5)
    assert reply.id and reply.meta.api_version.version == "2"


def test_cohere_errors_are_cohere_shaped_4xx(server_url) -> None:
    import cohere
    from cohere.core.api_error import ApiError

    client = _cohere(server_url)
    cases = [
        (lambda: client.embed(texts=["x"], model="tiny-embed", input_type="image"), 400, "input_type"),
        (lambda: client.embed(texts=["x"], model="tiny-embed", input_type="search_query",
                              embedding_types=["int4"]), 400, "embedding_types[0]"),
        (lambda: client.embed(texts=[], model="tiny-embed", input_type="search_query"), 400, "texts"),
        (lambda: client.embed(texts=["x"], model="tiny-embed", input_type="search_query",
                              truncate="MIDDLE"), 400, "truncate"),
        (lambda: client.embed(texts=["word " * 600], model="tiny-embed", input_type="search_query",
                              truncate="NONE"), 413, "the model takes at most"),
        (lambda: client.embed(texts=["x"], model="tiny-embed", input_type="search_query",
                              output_dimension=10_000), 400, "output_dimension"),
        (lambda: client.embed(texts=["x"], model="nope", input_type="search_query"), 404, "nope"),
        (lambda: client.embed(texts=["x"], model="tiny-rerank", input_type="search_query"), 400, "reranker"),
        (lambda: client.rerank(model="tiny-embed", query="q", documents=["d"]), 400, "embedding model"),
        (lambda: client.rerank(model="tiny-rerank", query="q", documents=[]), 400, "documents"),
        (lambda: client.rerank(model="tiny-rerank", query="q", documents=["d"], max_tokens_per_doc=8),
         400, "max_tokens_per_doc"),
    ]
    for call, status, message in cases:
        with pytest.raises(ApiError) as caught:
            call()
        assert caught.value.status_code == status, caught.value.body
        assert set(caught.value.body) == {"id", "message"} and message in caught.value.body["message"], \
            caught.value.body
    with pytest.raises(cohere.BadRequestError):
        client.embed(texts=["x"], model="tiny-embed", input_type="image")
    with _http(server_url) as http:
        wrong_type = http.post("/v2/embed", json={"texts": "not a list", "model": "tiny-embed"})
    assert wrong_type.status_code == 422 and "texts" in wrong_type.json()["message"]


def test_api_key_is_required_and_accepted_by_both_clients(server_url) -> None:
    import cohere
    from huggingface_hub.errors import HfHubHTTPError

    with pytest.raises(HfHubHTTPError) as caught:
        _hf(server_url, key="wrong").feature_extraction("x")
    assert caught.value.response.status_code == 401
    with pytest.raises(cohere.UnauthorizedError):
        _cohere(server_url, key="wrong").embed(texts=["x"], model="tiny-embed", input_type="search_query")
    assert httpx.post(server_url + "/", json={"inputs": "x"}, timeout=60).status_code == 401
    # The right key (every other test) goes through both clients' Authorization: Bearer.
    assert _hf(server_url).feature_extraction("x").shape == (1, 32)
