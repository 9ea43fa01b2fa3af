"""gRPC's Classify and EmbedSparse on a real scheduler (tests/scheduler_harness.py).

A classifier's Classify answers probabilities (softmax, as its problem_type says) or
the raw logits, against transformers; a SPLADE model's EmbedSparse answers only its
nonzeros (counts, indices, values), against sentence-transformers' SparseEncoder, and
``top_k`` keeps each sequence's largest. A call for a task the model does not do is
INVALID_ARGUMENT naming it; Info reports the classifier's labels.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import grpc
import numpy as np
import pytest
import torch

from embedserve import ragged
from embedserve.engine import Engine
from embedserve.link import wire
from embedserve.protos import inference_pb2
from embedserve.scheduler.settings import SchedulerSettings
from scheduler_harness import ThreadedScheduler
from task_models import build_classifier, build_splade

LABELS = ["spam", "ham", "eggs"]
TEXTS = ["The Eiffel tower is in Paris.", "Bananas are yellow.", "What is the capital of France?"]


@contextlib.contextmanager
def serving(model_dir: Path) -> Iterator[ThreadedScheduler]:
    """A scheduler over the model's engine; both stopped on the way out."""
    settings = SchedulerSettings(model_dir=model_dir, max_batch_tokens=4096, metrics_port=0)
    with Engine.load(model_dir) as engine:
        server = ThreadedScheduler(settings, engine)
        try:
            yield server
        finally:
            server.close()


def _tokens(model_dir: Path) -> tuple[list[list[int]], inference_pb2.PackedTokens]:
    import transformers

    ids = transformers.AutoTokenizer.from_pretrained(model_dir)(TEXTS)["input_ids"]
    return ids, wire.pack_tokens(ragged.from_sequences(ids))


def test_classify_probabilities_and_raw_logits(tmp_path: Path, minilm_dir: Path) -> None:
    import transformers

    model_dir = build_classifier(tmp_path / "clf", "BertForSequenceClassification", LABELS, None, minilm_dir)
    ids, packed = _tokens(model_dir)
    reference = transformers.AutoModelForSequenceClassification.from_pretrained(model_dir).eval()
    with torch.no_grad():
        logits = np.stack([reference(input_ids=torch.tensor([s])).logits[0].numpy() for s in ids])
    with serving(model_dir) as server:
        assert list(server.stub.Info(inference_pb2.InfoRequest()).labels) == LABELS
        probabilities = wire.tensor_to_array(server.stub.Classify(
            inference_pb2.ClassifyRequest(tokens=packed), timeout=60).scores)
        raw = wire.tensor_to_array(server.stub.Classify(
            inference_pb2.ClassifyRequest(tokens=packed, raw_scores=True), timeout=60).scores)
        with pytest.raises(grpc.RpcError) as refused:
            server.stub.Embed(inference_pb2.EmbedRequest(tokens=packed), timeout=60)
    np.testing.assert_allclose(probabilities, torch.from_numpy(logits).softmax(-1).numpy(), atol=1e-5, rtol=0)
    np.testing.assert_allclose(raw, logits, atol=1e-5, rtol=0)
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "'classify'" in refused.value.details()


def test_embed_sparse_sends_only_nonzeros(tmp_path: Path, minilm_dir: Path) -> None:
    from sentence_transformers import SparseEncoder

    model_dir = build_splade(tmp_path / "splade", minilm_dir, seed=2)
    reference = SparseEncoder(str(model_dir), device="cpu").encode(
        TEXTS, convert_to_tensor=True, convert_to_sparse_tensor=False).numpy()
    _, packed = _tokens(model_dir)
    with serving(model_dir) as server:
        full = server.stub.EmbedSparse(inference_pb2.EmbedSparseRequest(tokens=packed), timeout=60)
        top = server.stub.EmbedSparse(inference_pb2.EmbedSparseRequest(tokens=packed, top_k=4), timeout=60)
    counts = wire.tensor_to_array(full.counts)
    indices, values = wire.tensor_to_array(full.indices), wire.tensor_to_array(full.values)
    assert counts.tolist() == [int(np.count_nonzero(r)) for r in reference]
    assert len(full.values.data) == 4 * int(counts.sum())          # nothing vocabulary-wide on the wire
    ends = np.cumsum(counts)
    for row, (a, b) in zip(reference, zip(ends - counts, ends)):
        np.testing.assert_array_equal(indices[a:b], np.flatnonzero(row))
        np.testing.assert_allclose(values[a:b], row[indices[a:b]], atol=1e-4, rtol=0)
    assert wire.tensor_to_array(top.counts).tolist() == [4, 4, 4]
    top_indices = wire.tensor_to_array(top.indices).reshape(3, 4)
    for row, kept in zip(reference, top_indices):
        assert kept.tolist() == np.sort(np.argsort(-row, kind="stable")[:4]).tolist()


def test_bulk_embed_writes_sparse_list_columns(tmp_path: Path, minilm_dir: Path) -> None:
    """``embedserve embed --top-k 3`` on a SPLADE model: Parquet ``indices``/``values`` list
    columns, against SparseEncoder's top 3; a .npy output is refused before the model loads."""
    import json
    import os
    import subprocess
    import sys

    import pyarrow.parquet as pq
    from sentence_transformers import SparseEncoder

    model_dir = build_splade(tmp_path / "splade", minilm_dir, seed=2)
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"text": t}) + "\n" for t in TEXTS))
    reference = SparseEncoder(str(model_dir), device="cpu").encode(
        TEXTS, convert_to_tensor=True, convert_to_sparse_tensor=False).numpy()
    root = Path(__file__).resolve().parents[1]

    def embed(output: Path) -> subprocess.CompletedProcess:
        argv = [sys.executable, "-m", "embedserve.cli", "embed", str(corpus), "-o", str(output),
                "--model", str(model_dir), "--dtype", "float32", "--no-progress", "--top-k", "3"]
        return subprocess.run(argv, cwd=root, capture_output=True, text=True, timeout=300,
                              env={**os.environ, "PYTHONPATH": str(root)})

    done = embed(tmp_path / "out.parquet")
    assert done.returncode == 0, done.stderr
    table = pq.read_table(tmp_path / "out.parquet")
    assert table.column_names == ["id", "indices", "values", "tokens", "truncated", "chunked"]
    for row, indices, values in zip(reference, table.column("indices").to_pylist(),
                                    table.column("values").to_pylist()):
        expected = np.sort(np.argsort(-row, kind="stable")[:3])
        assert indices == expected.tolist()
        np.testing.assert_allclose(values, row[expected], atol=1e-4, rtol=0)
    refused = embed(tmp_path / "out.npy")
    assert refused.returncode == 2 and "Parquet list columns" in refused.stderr
