"""A real stack serving a model whose tokenizer only the tokenizers backend runs.

A tiny random BERT whose tokenizer.json is a Qwen3-Embedding-shaped byte-level BPE
trained here (template ``$A <|endoftext|>``, vocabulary sized to the model): one
scheduler process, the gateway on port 0. /info names the backend; /tokenize gives
the ids, pieces and offsets of ``tokenizers`` itself, the appended <|endoftext|>
marked special; /v1/embeddings embeds exactly those ids (compared with transformers
running the same weights on the reference ids).
"""

from __future__ import annotations

import numpy as np
import pytest
import tokenizers

from conftest import TINY_SIZES
from gateway_harness import one_replica_stack
from st_metadata import write_st_metadata
from trained_tokenizers import MULTILINGUAL, qwen3_bpe

TEXTS = ["The with statement wraps a block.", "日本語のテキスト", "emoji 👍🏽 and  spaces ",
         "<|endoftext|> is text here"]


@pytest.fixture(scope="module")
def bpe_model_dir(tmp_path_factory):
    import torch
    import transformers

    directory = tmp_path_factory.mktemp("tiny_bpe_bert")
    qwen3_bpe(directory / "tokenizer.json")
    vocab = tokenizers.Tokenizer.from_file(str(directory / "tokenizer.json")).get_vocab_size()
    config = transformers.BertConfig(**{**TINY_SIZES, "vocab_size": vocab}, max_position_embeddings=512,
                                     pad_token_id=0)
    torch.manual_seed(0)
    transformers.BertModel(config).eval().save_pretrained(directory, safe_serialization=True)
    write_st_metadata(directory, TINY_SIZES["hidden_size"], "mean", True)
    return directory


@pytest.fixture(scope="module")
def gateway(bpe_model_dir):
    with one_replica_stack(bpe_model_dir) as server:
        yield server


@pytest.fixture(scope="module")
def reference(bpe_model_dir):
    tokenizer = tokenizers.Tokenizer.from_file(str(bpe_model_dir / "tokenizer.json"))
    tokenizer.encode_special_tokens = True
    return tokenizer


def test_info_reports_the_tokenizers_backend(gateway):
    with gateway.client() as client:
        info = client.get("/info").json()
    assert info["tokenizer_backend"] == "tokenizers"


def test_tokenize_equals_tokenizers(gateway, reference):
    texts = TEXTS + [t for t in MULTILINGUAL if t]
    with gateway.client() as client:
        reply = client.post("/tokenize", json={"inputs": texts})
    assert reply.status_code == 200, reply.text
    for text, tokens in zip(texts, reply.json()):
        expected = reference.encode(text)
        assert [t["id"] for t in tokens] == expected.ids
        assert [t["piece"] for t in tokens] == expected.tokens
        assert [t["special"] for t in tokens] == [False] * (len(tokens) - 1) + [True]
        assert tokens[-1]["piece"] == "<|endoftext|>" and tokens[-1]["start"] is None
        assert [(t["start"], t["stop"]) for t in tokens[:-1]] == [tuple(o) for o in expected.offsets[:-1]]


def test_embeddings_embed_the_reference_ids(gateway, reference, bpe_model_dir):
    import torch
    import transformers

    with gateway.client() as client:
        reply = client.post("/v1/embeddings", json={"input": TEXTS, "model": bpe_model_dir.name})
    assert reply.status_code == 200, reply.text
    got = np.array([item["embedding"] for item in reply.json()["data"]], np.float64)
    model = transformers.BertModel.from_pretrained(bpe_model_dir).eval()
    expected = []
    with torch.no_grad():
        for text in TEXTS:
            ids = torch.tensor([reference.encode(text).ids])
            hidden = model(input_ids=ids).last_hidden_state[0].double()
            vector = hidden.mean(0)
            expected.append((vector / vector.norm()).numpy())
    cosines = (got * np.array(expected)).sum(1) / np.linalg.norm(got, axis=1)
    assert (cosines > 0.9999).all(), cosines


def test_int8_is_served_for_a_bpe_model(gateway, bpe_model_dir):
    # The replica's calibration tokenizes its texts as the gateway does (load_tokenizer).
    from sentence_transformers.util.quantization import quantize_embeddings

    with gateway.client() as client:
        reply = client.post("/v1/embeddings", json={"input": TEXTS, "model": bpe_model_dir.name,
                                                    "embedding_types": ["float", "int8"]})
        ranges = client.get("/v1/quantization/ranges")
    assert reply.status_code == 200, reply.text
    assert ranges.status_code == 200, ranges.text
    data = reply.json()["data"]
    floats = np.array([d["embedding"]["float"] for d in data], np.float32)
    int8 = np.array([d["embedding"]["int8"] for d in data], np.int8)
    expected = quantize_embeddings(floats, "int8", ranges=np.array(ranges.json()["ranges"], np.float32))
    assert np.array_equal(int8, expected)
