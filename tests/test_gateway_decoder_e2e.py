"""A decoder embedder end to end: ``embedserve serve`` on a tiny random Qwen3, the openai client.

The model directory is Qwen3-Embedding's layout at toy size: a Qwen3Model
checkpoint, a byte-level BPE tokenizer.json (trained by the test with
``tokenizers``) whose post-processor appends ``<|endoftext|>``, last-token
pooling + Normalize, and the "query" instruction prompt in
config_sentence_transformers.json. The reference is sentence-transformers
loading the same directory.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import openai
import pytest

import serve_harness
from decoder_models import build_decoder_dir

TEXTS = ["What is the capital of France?", "Paris is the capital of France.", "x",
         "Embeddings map text to vectors. " * 20, "é ü 中文 🙂"]
MIN_COSINE = 0.99999


@pytest.fixture(scope="module")
def qwen3_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_decoder_dir(tmp_path_factory.mktemp("qwen3_e2e"), "qwen3", "lasttoken", tokenizer=True)


@pytest.fixture(scope="module")
def served(qwen3_dir: Path) -> Iterator[str]:
    with serve_harness.served("--model", str(qwen3_dir), "--served-model-name", "qwen3-tiny") as url:
        yield url


@pytest.fixture(scope="module")
def reference(qwen3_dir: Path):
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(str(qwen3_dir), device="cpu")


def cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return (a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)


def test_openai_embeddings_match_sentence_transformers(served: str, reference) -> None:
    client = openai.OpenAI(base_url=served + "/v1", api_key="unused", max_retries=0)
    reply = client.embeddings.create(input=TEXTS, model="qwen3-tiny")
    ours = np.array([d.embedding for d in reply.data])
    expected = reference.encode(TEXTS)
    assert reply.model == "qwen3-tiny" and ours.shape == (len(TEXTS), 64)
    assert cosines(ours, expected).min() >= MIN_COSINE
    # usage counts the appended <|endoftext|>: one more token per text than the bare encoding
    bare = sum(len(reference.tokenizer(t, add_special_tokens=False)["input_ids"]) for t in TEXTS)
    assert reply.usage.prompt_tokens == bare + len(TEXTS)


def test_query_instruction_prompt_and_matryoshka_dimensions(served: str, reference) -> None:
    client = openai.OpenAI(base_url=served + "/v1", api_key="unused", max_retries=0)
    reply = client.embeddings.create(input=TEXTS[:2], model="qwen3-tiny", dimensions=16,
                                     extra_body={"input_type": "query"})
    ours = np.array([d.embedding for d in reply.data])
    expected = reference.encode(TEXTS[:2], prompt_name="query")[:, :16]
    expected /= np.linalg.norm(expected, axis=1, keepdims=True)
    assert ours.shape == (2, 16)
    assert cosines(ours, expected).min() >= MIN_COSINE
    plain = np.array([d.embedding for d in client.embeddings.create(input=TEXTS[:2], model="qwen3-tiny",
                                                      dimensions=16).data])
    assert cosines(ours, plain).max() < 0.9999          # the instruction really was prepended
