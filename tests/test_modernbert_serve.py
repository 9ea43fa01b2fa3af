"""``embedserve serve --model DIR`` with a tiny ModernBERT: byte-level BPE tokenizer,
sliding-window attention, mean pooling + Normalize, end to end.

The whole stack as one process tree (gateway + one replica) on port 0; the
official ``openai`` client and plain httpx ask for embeddings, which must
equal sentence-transformers' on the same directory. ModernBERT's tokenizer is
a byte-level BPE ``tokenizer.json`` (served through the ``tokenizers`` backend);
the same model with XLM-R's SentencePiece files runs through the native encoder.
"""

from __future__ import annotations

from pathlib import Path

import httpx
import numpy as np
import pytest

from modernbert_model import CORPUS, build_tiny_modernbert
from serve_harness import served

TEXTS = CORPUS + ["short", "ünïcödé and emoji 🙂 go through byte-level BPE",
                  "a " * 30 + "long one, far past the local window"]


@pytest.fixture(scope="module", params=["bpe", "sentencepiece"])
def modernbert_dir(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """ModernBERT's own kind of tokenizer (byte-level BPE, run by the ``tokenizers``
    backend), and XLM-R's SentencePiece files (the native encoder)."""
    xlmr = request.getfixturevalue("xlmr_tokenizer_dir") if request.param == "sentencepiece" else None
    return build_tiny_modernbert(tmp_path_factory.mktemp(f"modernbert_serve_{request.param}"),
                                 "mean", True, 3, xlmr_tokenizer_dir=xlmr)


@pytest.fixture(scope="module")
def server_url(modernbert_dir: Path):
    with served("--model", str(modernbert_dir), "--served-model-name", "tiny-modernbert") as url:
        yield url


def test_openai_embeddings_equal_sentence_transformers(modernbert_dir: Path, server_url: str) -> None:
    import openai
    from sentence_transformers import SentenceTransformer

    expected = SentenceTransformer(str(modernbert_dir), device="cpu").encode(TEXTS, convert_to_numpy=True)
    client = openai.OpenAI(base_url=server_url + "/v1", api_key="unused", max_retries=0)
    reply = client.embeddings.create(input=TEXTS, model="tiny-modernbert")
    got = np.array([d.embedding for d in reply.data])
    assert reply.model == "tiny-modernbert" and got.shape == (len(TEXTS), 64)
    cosines = (got * expected).sum(1) / np.linalg.norm(got, axis=1) / np.linalg.norm(expected, axis=1)
    assert cosines.min() >= 0.99999, dict(zip(TEXTS, cosines))
    assert np.allclose(np.linalg.norm(got, axis=1), 1, atol=1e-5)

    # The same through plain HTTP, one text at a time (no batching partner to hide behind).
    single = httpx.post(server_url + "/v1/embeddings", json={"input": TEXTS[-1], "model": "tiny-modernbert",
                                                             "encoding_format": "float"}, timeout=60)
    assert single.status_code == 200
    np.testing.assert_allclose(single.json()["data"][0]["embedding"], got[-1], atol=1e-5)


def test_too_long_input_is_a_clear_413(server_url: str) -> None:
    """Past the model's max_position_embeddings (128 here; RoPE has no table to overflow,
    the limit is the model's own)."""
    reply = httpx.post(server_url + "/v1/embeddings",
                       json={"input": "word " * 500, "model": "tiny-modernbert"}, timeout=60)
    assert reply.status_code == 413, reply.text
    error = reply.json()["error"]
    assert error["code"] == "input_too_long" and "at most 128" in error["message"]
