"""Reranking end to end: /rerank and /v1/rerank against transformers on a tiny cross-encoder."""

from __future__ import annotations

import numpy as np
import pytest

from gateway_harness import gateway_in_front_of

QUERY = "Where is the Eiffel tower?"
DOCS = ["The Eiffel tower is in Paris.", "Bananas are yellow.", "Paris is the capital of France.",
        "Der Eiffelturm steht in Paris.", "x"]


@pytest.fixture(scope="module")
def gateway(tiny_reranker_replica):
    with gateway_in_front_of(tiny_reranker_replica) as server:
        yield server


@pytest.fixture(scope="module")
def reference_logits(tiny_reranker_dir):
    import tokenizers
    import torch
    import transformers

    tokenizer = tokenizers.Tokenizer.from_file(str(tiny_reranker_dir / "tokenizer.json"))
    model = transformers.AutoModelForSequenceClassification.from_pretrained(tiny_reranker_dir).eval()
    logits = []
    for doc in DOCS:
        ids = tokenizer.encode(QUERY, doc).ids
        with torch.no_grad():
            logits.append(model(input_ids=torch.tensor([ids])).logits[0, 0].item())
    return np.array(logits)


def test_tei_rerank_matches_transformers(gateway, reference_logits):
    with gateway.client() as http:
        raw = http.post("/rerank", json={"query": QUERY, "texts": DOCS, "raw_scores": True,
                                         "return_text": True}).json()
        sig = http.post("/rerank", json={"query": QUERY, "texts": DOCS}).json()
    assert [r["index"] for r in raw] == list(np.argsort(-reference_logits, kind="stable"))
    np.testing.assert_allclose([r["score"] for r in raw], reference_logits[[r["index"] for r in raw]],
                               atol=1e-4)
    assert all(r["text"] == DOCS[r["index"]] for r in raw)
    np.testing.assert_allclose([r["score"] for r in sig],
                               1 / (1 + np.exp(-reference_logits[[r["index"] for r in sig]])), atol=1e-5)
    assert "text" not in sig[0]


def test_cohere_style_rerank(gateway, reference_logits, tiny_reranker_dir):
    documents = [DOCS[0], {"text": DOCS[1]}, *DOCS[2:]]
    with gateway.client() as http:
        reply = http.post("/v1/rerank", json={"query": QUERY, "documents": documents, "top_n": 3,
                                              "return_documents": True,
                                              "model": tiny_reranker_dir.name}).json()
    order = list(np.argsort(-reference_logits, kind="stable"))[:3]
    assert [r["index"] for r in reply["results"]] == order
    assert [r["document"]["text"] for r in reply["results"]] == [DOCS[i] for i in order]
    np.testing.assert_allclose([r["relevance_score"] for r in reply["results"]],
                               1 / (1 + np.exp(-reference_logits[order])), atol=1e-5)
    assert reply["model"] == tiny_reranker_dir.name and reply["usage"]["total_tokens"] > len(DOCS) * 6


def test_rerank_errors(gateway):
    with gateway.client() as http:
        empty = http.post("/rerank", json={"query": QUERY, "texts": []})
        blank_query = http.post("/rerank", json={"query": "", "texts": ["a"]})
        long_doc = http.post("/rerank", json={"query": QUERY, "texts": ["ok", "word " * 600]})
        truncated = http.post("/rerank", json={"query": QUERY, "texts": ["ok", "word " * 600],
                                               "truncate": True})
        embed = http.post("/v1/embeddings", json={"input": "not an embedder"})
    assert empty.status_code == 400 and empty.json()["error"]["param"] == "texts"
    assert blank_query.status_code == 400 and blank_query.json()["error"]["param"] == "query"
    assert long_doc.status_code == 413 and long_doc.json()["error"]["param"] == "texts[1]"
    assert truncated.status_code == 200 and len(truncated.json()) == 2
    assert embed.status_code == 400 and embed.json()["error"]["param"] == "model"
