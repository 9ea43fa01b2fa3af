"""An embedding model's token states (TEI's ``/embed_all`` for a plain embedder).

On a tiny random ``BertModel`` saved as a sentence-transformers folder (mean Pooling,
Normalize): every token's vector, special tokens included, equals transformers'
``last_hidden_state`` (per-token cosine >= 0.99999, float32; no pooling, normalization or
Dense). In the engine, a step some call asks token states of returns each sequence's
pooled row and its states, and each call takes its half (``call_rows``): a plain call in
the same step gets the same pooled rows as a step nobody asked states of. Through
``embedserve serve``: httpx on ``/embed_all`` (a batch, the model's prompt) while
``/embed`` calls run beside it, the public gRPC ``EmbedTokens``, and the refusals.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import grpc
import httpx
import numpy as np
import pytest
import torch

from embedserve.engine.batch import Batch
from embedserve.engine.engine import Engine
from embedserve.engine.token_rows import call_rows
from serve_harness import served_with_grpc
from task_models import SIZES, copy_minilm_tokenizer
from token_vectors import assert_same_token_vectors

TEXTS = ["The Eiffel tower is in Paris.", "Bananas are yellow.", "x"]
PROMPT = "query: "
TIMEOUT_S = 180


@pytest.fixture(scope="module")
def embedder_dir(tmp_path_factory, minilm_dir) -> Path:
    """A random BertModel with mean pooling and Normalize, and a ``query`` prompt."""
    import transformers
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.modules import (
        Normalize,
        Pooling,
        Transformer,
    )

    directory = tmp_path_factory.mktemp("embedder") / "bert"
    base = directory.parent / "base"
    torch.manual_seed(11)
    transformers.BertModel(transformers.BertConfig(vocab_size=30522, max_position_embeddings=512, **SIZES)) \
        .eval().save_pretrained(base, safe_serialization=True)
    copy_minilm_tokenizer(minilm_dir, base)
    model = SentenceTransformer(modules=[Transformer(str(base)), Pooling(32, "mean"), Normalize()],
                                device="cpu", prompts={"query": PROMPT})
    model.save(str(directory))
    return directory


def _reference_states(model_dir: Path, texts: list[str]) -> list[np.ndarray]:
    """transformers' last_hidden_state per text, every token (specials included)."""
    import transformers

    tokenizer = transformers.AutoTokenizer.from_pretrained(model_dir)
    model = transformers.AutoModel.from_pretrained(model_dir).eval()
    with torch.no_grad():
        return [model(**tokenizer(text, return_tensors="pt")).last_hidden_state[0].numpy() for text in texts]


def test_a_step_returns_token_states_and_each_call_its_half(embedder_dir: Path) -> None:
    import transformers

    tokenizer = transformers.AutoTokenizer.from_pretrained(embedder_dir)
    ids = [tokenizer(text)["input_ids"] for text in TEXTS]
    with Engine.load(embedder_dir) as engine:
        plain = engine.step(Batch.from_sequences(ids)).wait()
        mixed = engine.step(Batch.of(Batch.from_sequences(ids), "embed", token_states=True)).wait()
    assert mixed.shape == (len(TEXTS), 2)
    states = call_rows(mixed[1:], token_states=True)          # a call asking states: sequences 1-2
    assert_same_token_vectors(list(call_rows(mixed[:1], True)) + list(states), _reference_states(embedder_dir, TEXTS))
    pooled = call_rows(mixed, token_states=False)              # a plain call in the same step
    assert pooled.dtype == np.float32 and pooled.shape == plain.shape
    np.testing.assert_allclose(pooled, plain, rtol=0, atol=1e-6)
    assert call_rows(plain, token_states=False) is plain      # a step nobody asked states of


@pytest.fixture(scope="module")
def stack(embedder_dir: Path):
    with served_with_grpc("--model", f"{embedder_dir}:name=bert") as (url, address):
        yield url, address


def test_embed_all_returns_last_hidden_states_beside_embed_calls(stack, embedder_dir: Path) -> None:
    url, _ = stack
    expected_pooled = httpx.post(f"{url}/embed", json={"inputs": TEXTS}, timeout=TIMEOUT_S).json()

    async def both() -> tuple[httpx.Response, list[httpx.Response]]:
        async with httpx.AsyncClient(timeout=TIMEOUT_S) as client:
            states = client.post(f"{url}/embed_all", json={"inputs": TEXTS})
            embeds = [client.post(f"{url}/embed", json={"inputs": TEXTS}) for _ in range(4)]
            answers = await asyncio.gather(states, *embeds)
            return answers[0], list(answers[1:])

    states, embeds = asyncio.run(both())
    assert states.status_code == 200, states.text
    assert_same_token_vectors(states.json(), _reference_states(embedder_dir, TEXTS))
    for reply in embeds:      # the /embed calls batched beside it still get pooled, normalized rows
        np.testing.assert_allclose(reply.json(), expected_pooled, rtol=0, atol=1e-5)
    one = httpx.post(f"{url}/embed_all", json={"inputs": TEXTS[0], "prompt_name": "query"}, timeout=TIMEOUT_S)
    assert_same_token_vectors(one.json(), _reference_states(embedder_dir, [PROMPT + TEXTS[0]]))


def test_embed_all_grpc_and_refusals(stack, embedder_dir: Path) -> None:
    from embedserve.protos import embeddings_pb2, embeddings_pb2_grpc

    url, address = stack
    with grpc.insecure_channel(address) as channel:
        reply = embeddings_pb2_grpc.EmbeddingsStub(channel).EmbedTokens(
            embeddings_pb2.EmbedTokensTextRequest(inputs=TEXTS[:2]), timeout=TIMEOUT_S)
    assert reply.dimension == 32
    assert_same_token_vectors([np.array(t.values, np.float32).reshape(t.rows, reply.dimension) for t in reply.inputs],
                        _reference_states(embedder_dir, TEXTS[:2]))
    typed = httpx.post(f"{url}/embed_all", json={"inputs": "x", "input_type": "query"}, timeout=TIMEOUT_S)
    assert typed.status_code == 400 and "input_type applies to a multi-vector model" in typed.text
    chunked = httpx.post(f"{url}/embed_all", json={"inputs": "x", "truncate": "chunk"}, timeout=TIMEOUT_S)
    assert chunked.status_code == 400 and "truncate='chunk'" in chunked.text
    info = httpx.get(f"{url}/info", timeout=10).json()
    assert "/embed_all" in info["routes"], info
