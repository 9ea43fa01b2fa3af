"""LLM rerankers (Qwen3-Reranker as a causal LM, and converted to Qwen3ForSequenceClassification)
against the model card's reference computation with transformers, in the engine and through
``embedserve serve`` on ``/rerank`` and ``/v1/rerank`` (tests/llm_reranker_models.py)."""

from __future__ import annotations

from pathlib import Path

import httpx
import numpy as np
import pytest

from llm_reranker_models import build_llm_reranker, model_card_scores
from serve_harness import served

QUERY = "What is the capital of France?"
DOCS = ["Paris is the capital of France.", "Bananas are yellow.", "The Eiffel tower is in Paris, France.", "no"]


@pytest.mark.parametrize("architecture", ["Qwen3ForCausalLM", "Qwen3ForSequenceClassification"])
def test_engine_scores_equal_the_model_card(tmp_path: Path, architecture: str) -> None:
    import transformers

    from embedserve.engine import Batch, Engine
    from embedserve.model import llm_reranker
    from embedserve.model.info import read_model_info
    from embedserve.model.postprocess import sigmoid

    directory = build_llm_reranker(tmp_path / "reranker", architecture)
    info = read_model_info(directory)
    assert (info.task, info.pooling, info.pair_template) == ("score", "lasttoken", "qwen3_reranker")
    tokenizer = transformers.AutoTokenizer.from_pretrained(directory)
    prefix = tokenizer.encode(llm_reranker.PREFIX, add_special_tokens=False)
    suffix = tokenizer.encode(llm_reranker.SUFFIX, add_special_tokens=False)
    sequences = [prefix + tokenizer(llm_reranker.format_pair(QUERY, d), add_special_tokens=False)["input_ids"]
                 + suffix for d in DOCS]
    with Engine.load(directory) as engine:
        logits = engine.step(Batch.from_sequences(sequences, "score")).wait()
    np.testing.assert_allclose(sigmoid(logits), model_card_scores(directory, QUERY, DOCS), atol=1e-5, rtol=0)


def test_an_embedder_folder_of_the_same_architecture_stays_an_embedder(tmp_path: Path) -> None:
    from decoder_models import build_decoder_dir
    from embedserve.model.info import read_model_info

    directory = build_decoder_dir(tmp_path / "embedder", "qwen3_causal_lm")
    assert read_model_info(directory).task == "embed"


@pytest.fixture(scope="module")
def reranker_dir(tmp_path_factory) -> Path:
    return build_llm_reranker(tmp_path_factory.mktemp("qwen3_reranker"), "Qwen3ForCausalLM", seed=4)


def test_rerank_routes_answer_the_model_card_scores(reranker_dir: Path) -> None:
    expected = np.array(model_card_scores(reranker_dir, QUERY, DOCS))
    instructed = np.array(model_card_scores(reranker_dir, QUERY, DOCS, instruction="Find the capital"))
    with served("--model", str(reranker_dir)) as url:
        tei = httpx.post(f"{url}/rerank", json={"query": QUERY, "texts": DOCS}, timeout=180)
        cohere = httpx.post(f"{url}/v1/rerank", json={"query": QUERY, "documents": DOCS, "top_n": 2},
                            timeout=180)
        own = httpx.post(f"{url}/rerank", json={"query": QUERY, "texts": DOCS,
                                                 "instruction": "Find the capital"}, timeout=180)
        raw = httpx.post(f"{url}/rerank", json={"query": QUERY, "texts": DOCS, "raw_scores": True}, timeout=180)
        info = httpx.get(f"{url}/info", timeout=10).json()
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
    assert (info["task"], info["model_type"]) == ("score", "reranker")


def test_grpc_score_of_prompted_pairs(tmp_path: Path) -> None:
    """gRPC Score on a replica takes the pairs already in the model card's prompt."""
    import transformers
    from scheduler_harness import ThreadedScheduler

    from embedserve import ragged, wire
    from embedserve.engine import Engine
    from embedserve.model import llm_reranker
    from embedserve.protos import inference_pb2
    from embedserve.scheduler.settings import SchedulerSettings

    directory = build_llm_reranker(tmp_path / "reranker", "Qwen3ForCausalLM", seed=9)
    tokenizer = transformers.AutoTokenizer.from_pretrained(directory)
    prefix = tokenizer.encode(llm_reranker.PREFIX, add_special_tokens=False)
    suffix = tokenizer.encode(llm_reranker.SUFFIX, add_special_tokens=False)
    pairs = [prefix + tokenizer(llm_reranker.format_pair(QUERY, d), add_special_tokens=False)["input_ids"]
             + suffix for d in DOCS]
    settings = SchedulerSettings(model_dir=directory, max_batch_tokens=4096, metrics_port=0)
    with Engine.load(directory) as engine:
        server = ThreadedScheduler(settings, engine)
        try:
            reply = server.stub.Score(inference_pb2.ScoreRequest(
                pairs=wire.pack_tokens(ragged.from_sequences(pairs)), sigmoid=True), timeout=60)
        finally:
            server.close()
    np.testing.assert_allclose(wire.tensor_to_array(reply.scores), model_card_scores(directory, QUERY, DOCS),
                               atol=1e-5, rtol=0)
