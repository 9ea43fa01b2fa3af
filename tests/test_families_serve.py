"""``embedserve serve`` with the new families, end to end over HTTP.

One deployment of three tiny models (tests/family_models.py), one replica each:
an MPNet embedder (native WordPiece tokenizer, relative-position bias), an
EmbeddingGemma-shaped Gemma3 (byte-fallback BPE through ``tokenizers``, two
Dense modules, named prompts) and a DeBERTa-v3 reranker (native Unigram,
disentangled attention). The official ``openai`` client and plain httpx ask;
every answer must equal sentence-transformers' (``SentenceTransformer`` /
``CrossEncoder``) on the same directories.
"""

from __future__ import annotations

from pathlib import Path

import httpx
import numpy as np
import pytest

from family_models import build_embeddinggemma_dir, build_family_dir
from serve_harness import served

TEXTS = ["The quick brown fox jumps over the lazy dog.", "x", "Paris is the capital of France.",
         "Ünïcödé café 🙂", "word " * 24 + "and a long one"]
QUERY = "Where is the Eiffel tower?"


@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return {"mpnet": build_family_dir(tmp_path_factory.mktemp("serve_mpnet"), "mpnet"),
            "gemma": build_embeddinggemma_dir(tmp_path_factory.mktemp("serve_gemma") / "model"),
            "rerank": build_family_dir(tmp_path_factory.mktemp("serve_deberta"), "deberta-v2", reranker=True)}


@pytest.fixture(scope="module")
def server_url(model_dirs: dict[str, Path]):
    with served("--model", f"{model_dirs['mpnet']}:name=tiny-mpnet",
                "--model", f"{model_dirs['gemma']}:name=tiny-gemma",
                "--model", f"{model_dirs['rerank']}:name=tiny-deberta") as url:
        yield url


def _min_cosine(a: np.ndarray, b: np.ndarray) -> float:
    return float(((a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)).min())


def test_mpnet_openai_embeddings_equal_sentence_transformers(model_dirs: dict[str, Path], server_url: str) -> None:
    import openai
    from sentence_transformers import SentenceTransformer

    expected = SentenceTransformer(str(model_dirs["mpnet"]), device="cpu").encode(TEXTS, convert_to_numpy=True)
    client = openai.OpenAI(base_url=server_url + "/v1", api_key="unused", max_retries=0)
    reply = client.embeddings.create(input=TEXTS, model="tiny-mpnet")
    got = np.array([d.embedding for d in reply.data])
    assert got.shape == expected.shape
    assert _min_cosine(got, expected) >= 0.99999


def test_gemma_dense_and_prompt_over_tei_embed(model_dirs: dict[str, Path], server_url: str) -> None:
    """TEI's /embed with prompt_name: the Dense modules' 48 dimensions, the prompt
    prepended as sentence-transformers' encode(prompt_name=...) does."""
    from sentence_transformers import SentenceTransformer

    st = SentenceTransformer(str(model_dirs["gemma"]), device="cpu")
    reply = httpx.post(server_url + "/embed", json={"inputs": TEXTS, "model": "tiny-gemma",
                                                    "prompt_name": "query"}, timeout=60)
    assert reply.status_code == 200, reply.text
    got = np.array(reply.json())
    expected = st.encode(TEXTS, prompt_name="query", convert_to_numpy=True)
    assert got.shape == (len(TEXTS), 48)
    assert _min_cosine(got, expected) >= 0.99999
    plain = np.array(httpx.post(server_url + "/embed", json={"inputs": TEXTS[:1], "model": "tiny-gemma"},
                                timeout=60).json())
    assert _min_cosine(plain, st.encode(TEXTS[:1], convert_to_numpy=True)) >= 0.99999
    assert _min_cosine(plain, got[:1]) < 0.9999          # the prompt changed the vector


def test_deberta_rerank_equals_cross_encoder(model_dirs: dict[str, Path], server_url: str) -> None:
    from sentence_transformers import CrossEncoder

    expected = CrossEncoder(str(model_dirs["rerank"]), device="cpu").predict([(QUERY, t) for t in TEXTS])
    reply = httpx.post(server_url + "/rerank", json={"query": QUERY, "texts": TEXTS, "model": "tiny-deberta"},
                       timeout=60)
    assert reply.status_code == 200, reply.text
    scores = np.zeros(len(TEXTS))
    for item in reply.json():
        scores[item["index"]] = item["score"]
    assert np.abs(scores - expected).max() <= 1e-5
    wrong_task = httpx.post(server_url + "/embed", json={"inputs": "a", "model": "tiny-deberta"}, timeout=60)
    assert wrong_task.status_code == 400, wrong_task.text
