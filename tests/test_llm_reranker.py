"""LLM rerankers (Qwen3-Reranker as a causal LM, and converted to Qwen3ForSequenceClassification)
against the model card's reference computation with transformers, in the engine and over a
replica's gRPC Score (tests/llm_reranker_models.py); through ``embedserve serve`` on
``/rerank`` and ``/v1/rerank``: tests/test_tasks_serve.py."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from llm_reranker_models import build_llm_reranker, model_card_scores

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


def test_int8_scores_stay_close_to_the_model_card(tmp_path: Path) -> None:
    """``--dtype int8`` on an LLM reranker (its decoder layers' linears int8, the score row
    not): the model card's scores within a few hundredths, the same order."""
    import transformers

    from embedserve.engine import Batch, Engine, int8_layers
    from embedserve.model import llm_reranker
    from embedserve.model.postprocess import sigmoid

    directory = build_llm_reranker(tmp_path / "reranker", "Qwen3ForCausalLM")
    tokenizer = transformers.AutoTokenizer.from_pretrained(directory)
    prefix = tokenizer.encode(llm_reranker.PREFIX, add_special_tokens=False)
    suffix = tokenizer.encode(llm_reranker.SUFFIX, add_special_tokens=False)
    sequences = [prefix + tokenizer(llm_reranker.format_pair(QUERY, d), add_special_tokens=False)["input_ids"]
                 + suffix for d in DOCS]
    with Engine.load(directory, dtype="int8") as engine:
        assert engine.info.dtype == "int8"
        assert isinstance(engine.model.layers[0].qkv, int8_layers.Int8Linear)
        scores = sigmoid(engine.step(Batch.from_sequences(sequences, "score")).wait())
    expected = model_card_scores(directory, QUERY, DOCS)
    assert np.abs(scores - expected).max() <= 0.03, (scores, expected)
    assert np.abs(scores - expected).max() > 1e-5                       # int8's answer, not float32's
    assert list(np.argsort(scores)) == list(np.argsort(expected))


def test_an_embedder_folder_of_the_same_architecture_stays_an_embedder(tmp_path: Path) -> None:
    from decoder_models import build_decoder_dir
    from embedserve.model.info import read_model_info

    directory = build_decoder_dir(tmp_path / "embedder", "qwen3_causal_lm")
    assert read_model_info(directory).task == "embed"


def test_grpc_score_of_prompted_pairs(tmp_path: Path) -> None:
    """gRPC Score on a replica takes the pairs already in the model card's prompt."""
    import transformers

    from embedserve import ragged
    from embedserve.engine import Engine
    from embedserve.link import wire
    from embedserve.model import llm_reranker
    from embedserve.protos import inference_pb2
    from embedserve.scheduler.settings import SchedulerSettings
    from scheduler_harness import ThreadedScheduler

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
