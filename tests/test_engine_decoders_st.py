"""Decoder embedders vs sentence-transformers loading the same directory.

Transformer + Pooling(lasttoken or mean) + Normalize, with a byte-level BPE
tokenizer.json trained by the test whose post-processor appends
``<|endoftext|>`` (Qwen3-Embedding's convention). Our engine runs the ids the
directory's own tokenizer produces (EOS included), packed in one batch;
sentence-transformers pads (left, as Qwen's tokenizers do) and masks.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import transformers

from decoder_models import EOS, QUERY_PROMPT, build_decoder_dir
from embedserve.engine import Batch, Engine
from embedserve.model.postprocess import postprocess_embeddings

TEXTS = ["What is the capital of France?", "Paris", "The quick brown fox jumps over the lazy dog. " * 12,
         "Embeddings map text to vectors, one per passage.", "é ü 中文 🙂", "x"]


def encode_ids(model_dir: Path, texts: list[str]) -> list[np.ndarray]:
    tokenizer = transformers.AutoTokenizer.from_pretrained(model_dir)
    return [np.asarray(tokenizer(t)["input_ids"], dtype=np.int32) for t in texts]


@pytest.mark.parametrize("variant, pooling", [("qwen3", "lasttoken"), ("qwen3_causal_lm", "lasttoken"),
                                              ("qwen2", "lasttoken"), ("mistral", "mean")])
def test_engine_matches_sentence_transformers(variant: str, pooling: str, tmp_path: Path) -> None:
    sentence_transformers = pytest.importorskip("sentence_transformers")
    model_dir = build_decoder_dir(tmp_path / variant, variant, pooling, tokenizer=True)
    st = sentence_transformers.SentenceTransformer(str(model_dir), device="cpu")
    texts = TEXTS + [QUERY_PROMPT + t for t in TEXTS[:2]]
    expected = st.encode(texts, batch_size=4, convert_to_numpy=True)
    sequences = encode_ids(model_dir, texts)
    eos_id = transformers.AutoTokenizer.from_pretrained(model_dir).convert_tokens_to_ids(EOS)
    assert all(ids[-1] == eos_id for ids in sequences)            # the post-processor's EOS
    with Engine.load(model_dir) as engine:
        raw = engine.step(Batch.from_sequences(sequences)).wait()
        ours = postprocess_embeddings(raw, normalize=engine.info.normalize)
    cosines = (ours * expected).sum(1) / np.linalg.norm(expected, axis=1)
    assert cosines.min() >= 0.99999, cosines
    assert np.abs(ours - expected).max() <= 1e-4


def test_query_prompt_is_prepended_as_sentence_transformers_does(tmp_path: Path) -> None:
    """ModelInfo.prompt("query") + text gives what encode(prompt_name="query") embeds."""
    sentence_transformers = pytest.importorskip("sentence_transformers")
    model_dir = build_decoder_dir(tmp_path / "qwen3", "qwen3", tokenizer=True)
    st = sentence_transformers.SentenceTransformer(str(model_dir), device="cpu")
    expected = st.encode(TEXTS[:3], prompt_name="query", convert_to_numpy=True)
    with Engine.load(model_dir) as engine:
        prompt = engine.info.prompt("query", "prompt_name")
        sequences = encode_ids(model_dir, [prompt + t for t in TEXTS[:3]])
        ours = postprocess_embeddings(engine.step(Batch.from_sequences(sequences)).wait(), normalize=True)
    assert ((ours * expected).sum(1)).min() >= 0.99999
