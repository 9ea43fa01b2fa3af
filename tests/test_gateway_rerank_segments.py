"""A BERT cross-encoder with a WordPiece tokenizer, reranked end to end: the gateway loads
the tokenizer.json natively, and each pair reaches the engine with BERT's segment ids
(0 for ``[CLS] query [SEP]``, 1 for ``doc [SEP]``), as transformers scores it."""

from __future__ import annotations

import shutil

import numpy as np
import pytest

from gateway_harness import GatewayServer, SchedulerProcess, gateway_settings

QUERY = "Where is the Eiffel tower?"
DOCS = ["The Eiffel tower is in Paris.", "Bananas are yellow.", "Paris is the capital of France.",
        "Der Eiffelturm steht in Paris.", "x"]
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")


@pytest.fixture(scope="module")
def wordpiece_reranker_dir(tmp_path_factory, minilm_dir):
    """A random tiny BertForSequenceClassification (one label) with MiniLM's tokenizer files."""
    import torch
    import transformers

    config = transformers.BertConfig(vocab_size=30522, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                     intermediate_size=64, type_vocab_size=2, max_position_embeddings=512,
                                     num_labels=1, initializer_range=0.25)
    torch.manual_seed(0)
    model = transformers.BertForSequenceClassification(config).eval()
    directory = tmp_path_factory.mktemp("wordpiece_reranker")
    model.save_pretrained(directory, safe_serialization=True)
    for name in TOKENIZER_FILES:
        shutil.copy(minilm_dir / name, directory / name)
    return directory


@pytest.fixture(scope="module")
def reference_logits(wordpiece_reranker_dir):
    """transformers' logits with the segment ids tokenizers gives, and with all zeros."""
    import tokenizers
    import torch
    import transformers

    tokenizer = tokenizers.Tokenizer.from_file(str(wordpiece_reranker_dir / "tokenizer.json"))
    tokenizer.no_padding()
    model = transformers.AutoModelForSequenceClassification.from_pretrained(wordpiece_reranker_dir).eval()
    with_segments, without = [], []
    for doc in DOCS:
        encoding = tokenizer.encode(QUERY, doc)
        ids = torch.tensor([encoding.ids])
        assert 1 in encoding.type_ids
        with torch.no_grad():
            with_segments.append(model(input_ids=ids, token_type_ids=torch.tensor([encoding.type_ids]))
                                 .logits[0, 0].item())
            without.append(model(input_ids=ids, token_type_ids=torch.zeros_like(ids)).logits[0, 0].item())
    return np.array(with_segments), np.array(without)


def test_pairs_reach_the_engine_with_segment_ids(wordpiece_reranker_dir, reference_logits):
    with_segments, without = reference_logits
    # The premise: segment ids change this model's scores, so dropping them would show.
    assert np.abs(with_segments - without).max() > 1e-2
    replica = SchedulerProcess(wordpiece_reranker_dir, threads=1)
    try:
        server = GatewayServer(gateway_settings(wordpiece_reranker_dir, [replica.address]))
        try:
            server.wait_ready()
            with server.client() as http:
                info = http.get("/info").json()
                raw = http.post("/rerank", json={"query": QUERY, "texts": DOCS, "raw_scores": True}).json()
                tokens = http.post("/tokenize", json={"inputs": "Hello, World!"}).json()
        finally:
            server.stop()
    finally:
        replica.stop()
    scores = np.empty(len(DOCS))
    for item in raw:
        scores[item["index"]] = item["score"]
    np.testing.assert_allclose(scores, with_segments, atol=1e-4)
    assert [t["id"] for t in tokens[0]] == [101, 7592, 1010, 2088, 999, 102]
    assert info["replicas"]
