"""The engine's task outputs against their references, on tiny random checkpoints.

- classifiers (``BertForSequenceClassification``, ``XLMRobertaForSequenceClassification``
  with several labels): logits through ``classification_probabilities`` (softmax or
  sigmoid as ``problem_type`` says) against transformers' own, within 1e-5;
- SPLADE (``BertForMaskedLM`` or ``DistilBertForMaskedLM`` + SpladePooling): the same
  nonzero indices, and values within 1e-4, as sentence-transformers'
  ``SparseEncoder.encode``, for max and sum pooling and both activations, also with
  token blocks that cut through sequences; a DistilBertForMaskedLM folder without the
  SparseEncoder files stays an embedder (as SentenceTransformer loads it).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from embedserve.engine.batch import Batch
from embedserve.engine.engine import Engine
from embedserve.engine.modules import sparse
from embedserve.model.info import read_model_info
from embedserve.model.postprocess import classification_probabilities, sparse_rows
from task_models import build_classifier, build_splade

LABELS = ["negative", "neutral", "positive", "mixed"]
TEXTS = ["The Eiffel tower is in Paris.", "bananas", "What is the capital of France? " * 6,
         "Der Eiffelturm steht in Paris.", "x", "a much longer sentence about rivers, cities and trees"]


def _random_sequences(vocab: int, seed: int, count: int = 7) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return [rng.integers(3, vocab, size=int(n)).tolist() for n in rng.integers(2, 40, size=count)]


@pytest.mark.parametrize("architecture,problem_type,activation", [
    ("BertForSequenceClassification", None, "softmax"),
    ("BertForSequenceClassification", "single_label_classification", "softmax"),
    ("XLMRobertaForSequenceClassification", "multi_label_classification", "sigmoid"),
])
def test_classifier_probabilities_equal_transformers(tmp_path: Path, architecture: str,
                                                     problem_type: str | None, activation: str) -> None:
    import transformers

    directory = build_classifier(tmp_path / "clf", architecture, LABELS, problem_type, None, vocab_size=1000)
    info = read_model_info(directory)
    assert (info.task, info.labels, info.activation) == ("classify", tuple(LABELS), activation)
    sequences = _random_sequences(1000, 3)
    if architecture.startswith("XLMRoberta"):
        sequences = [[0, *s, 2] for s in sequences]
    reference_model = transformers.AutoModelForSequenceClassification.from_pretrained(directory).eval()
    expected = []
    with torch.no_grad():
        for ids in sequences:
            logits = reference_model(input_ids=torch.tensor([ids])).logits[0]
            expected.append((logits.softmax(-1) if activation == "softmax" else logits.sigmoid()).numpy())
    with Engine.load(directory) as engine:
        logits = engine.step(Batch.from_sequences(sequences, "classify")).wait()
    assert logits.shape == (len(sequences), len(LABELS))
    probabilities = classification_probabilities(logits, info.activation)
    np.testing.assert_allclose(probabilities, np.stack(expected), atol=1e-5, rtol=0)


def test_a_one_label_classifier_stays_a_reranker(tmp_path: Path) -> None:
    directory = build_classifier(tmp_path / "one", "BertForSequenceClassification", ["score"], None, None,
                                 vocab_size=1000)
    assert read_model_info(directory).task == "score"


@pytest.fixture(scope="module")
def splade_reference_ids(minilm_dir: Path) -> list[list[int]]:
    import transformers

    tokenizer = transformers.AutoTokenizer.from_pretrained(minilm_dir)
    return tokenizer(TEXTS)["input_ids"]


@pytest.mark.parametrize("architecture,strategy,activation,block", [
    ("BertForMaskedLM", "max", "relu", None), ("BertForMaskedLM", "max", "relu", 7),
    ("BertForMaskedLM", "sum", "relu", None), ("BertForMaskedLM", "max", "log1p_relu", 5),
    ("DistilBertForMaskedLM", "max", "relu", None), ("DistilBertForMaskedLM", "max", "log1p_relu", 7)])
def test_splade_equals_sparse_encoder(tmp_path: Path, minilm_dir: Path, splade_reference_ids,
                                      monkeypatch: pytest.MonkeyPatch, architecture: str, strategy: str,
                                      activation: str, block: int | None) -> None:
    from sentence_transformers import SparseEncoder

    directory = build_splade(tmp_path / "splade", minilm_dir, strategy, activation, architecture=architecture)
    info = read_model_info(directory)
    assert (info.task, info.dimension) == ("sparse", 30522)
    reference = SparseEncoder(str(directory), device="cpu").encode(
        TEXTS, convert_to_tensor=True, convert_to_sparse_tensor=False).numpy()
    if block is not None:
        monkeypatch.setattr(sparse, "TOKEN_BLOCK", block)   # blocks that cut through sequences
    with Engine.load(directory) as engine:
        rows = engine.step(Batch.from_sequences(splade_reference_ids, "sparse")).wait()
    assert rows.shape == reference.shape
    counts, indices, values = sparse_rows(rows, None)
    start = 0
    for i, count in enumerate(counts):
        expected_indices = np.flatnonzero(reference[i])
        assert 0 < expected_indices.size < 30522 // 4          # the test model is sparse, not empty
        np.testing.assert_array_equal(indices[start:start + count], expected_indices)
        np.testing.assert_allclose(values[start:start + count], reference[i][expected_indices],
                                   atol=1e-4, rtol=0)
        start += count


def test_a_distilbert_masked_lm_without_sparse_encoder_files_stays_an_embedder(tmp_path: Path,
                                                                              minilm_dir: Path) -> None:
    directory = build_splade(tmp_path / "distilbert", minilm_dir, architecture="DistilBertForMaskedLM",
                             sparse_encoder_files=False)
    info = read_model_info(directory)
    assert (info.task, info.pooling, info.dimension) == ("embed", "mean", 32)


def test_sparse_top_k_keeps_the_largest_weights(tmp_path: Path) -> None:
    rows = np.array([[0, 3, 0, 1, 2, 0], [0, 0, 0, 0, 0, 0], [5, 0, 0, 0, 0, 4]], dtype=np.float32)
    counts, indices, values = sparse_rows(rows, 2)
    assert counts.tolist() == [2, 0, 2]
    assert indices.tolist() == [1, 4, 0, 5]           # by index, as SparseEncoder's coalesced tensors
    assert values.tolist() == [3, 2, 5, 4]
    from sentence_transformers.util import select_max_active_dims

    pruned = select_max_active_dims(torch.from_numpy(rows), 2).numpy()
    assert [np.flatnonzero(r).tolist() for r in pruned] == [[1, 4], [], [0, 5]]
