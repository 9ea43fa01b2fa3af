"""A multi-vector (ColBERT) model in the engine against sentence-transformers' MultiVectorEncoder.

On a tiny random ``BertModel`` saved by sentence-transformers as a MultiVectorEncoder
folder (token-level Dense projection, punctuation skiplist, Normalize, ``[Q] `` /
``[D] `` marker prompts; tests/task_models.py): the engine's token vectors, after the
replica's skiplist and normalization (``model/postprocess.token_vectors``), have the
same token count as ``encode_query`` / ``encode_document`` and a per-token cosine of
at least 0.99999 (float32); the gateway's MaxSim equals ``MultiVectorEncoder.similarity``;
what is not served fails at load with its reason. The replica's ``EmbedTokens`` over
gRPC (a real scheduler, the batch class named) and ``embedserve embed`` (a Parquet
list<list<float32>> ``embedding`` column) against the same reference. The same model
through ``embedserve serve`` (HTTP and the public gRPC API): tests/test_tasks_serve.py.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from embedserve.engine.batch import Batch
from embedserve.engine.engine import Engine
from embedserve.errors import ModelLoadError
from embedserve.gateway.multivector_outputs import maxsim
from embedserve.model.info import read_model_info
from embedserve.model.postprocess import token_vectors
from task_models import MULTIVECTOR_PROMPTS, build_multivector
from token_vectors import assert_same_token_vectors

QUERIES = ["What is the capital of France?", "bananas!"]
# Punctuation the skiplist drops from documents (and the [ ] of the "[D] " marker).
DOCS = ["Paris is the capital of France.", "Bananas are yellow; apples (mostly) are red!",
        "x", "The Eiffel tower, in Paris, is 330 m tall."]


@pytest.fixture(scope="module")
def colbert_dir(tmp_path_factory, minilm_dir) -> Path:
    return build_multivector(tmp_path_factory.mktemp("colbert") / "colbert", minilm_dir, seed=7)


@pytest.fixture(scope="module")
def reference(colbert_dir: Path):
    from sentence_transformers import MultiVectorEncoder

    return MultiVectorEncoder(str(colbert_dir), device="cpu")


def _ours(colbert_dir: Path, reference, texts: list[str], task: str) -> list[np.ndarray]:
    """The engine's vectors for ``texts`` as ``task``, tokenized with the model's own
    tokenizer and marker prompt (the gateway's tokenizer: tests/test_tasks_serve.py)."""
    info = read_model_info(colbert_dir)
    prompt = MULTIVECTOR_PROMPTS[task]
    ids = [reference.tokenizer(prompt + text)["input_ids"] for text in texts]
    batch = Batch.from_sequences(ids, "multivector")
    with Engine.load(colbert_dir) as engine:
        rows = engine.step(batch).wait()
    assert info.multivector is not None
    counts, vectors = token_vectors(rows, batch.token_ids, batch.cu_seqlens, info.multivector,
                                    info.normalize, task)
    ends = np.cumsum(counts)
    return [vectors[a:b] for a, b in zip(ends - counts, ends, strict=True)]


@pytest.mark.parametrize("task", ["query", "document"])
def test_token_vectors_equal_multivector_encoder(colbert_dir: Path, reference, task: str) -> None:
    texts = QUERIES if task == "query" else DOCS
    encode = reference.encode_query if task == "query" else reference.encode_document
    expected = [e.numpy() for e in encode(texts)]
    ours = _ours(colbert_dir, reference, texts, task)
    assert_same_token_vectors(ours, expected, labels=texts)
    if task == "document":   # the skiplist dropped something: punctuation, the marker's [ ]
        tokens = [len(reference.tokenizer(MULTIVECTOR_PROMPTS["document"] + t)["input_ids"]) for t in texts]
        assert all(len(v) < n for v, n in zip(ours, tokens, strict=True))


def test_maxsim_equals_multivector_encoder_similarity(colbert_dir: Path, reference) -> None:
    expected = reference.similarity(reference.encode_query(QUERIES), reference.encode_document(DOCS)).numpy()
    queries = _ours(colbert_dir, reference, QUERIES, "query")
    documents = _ours(colbert_dir, reference, DOCS, "document")
    ours = np.stack([maxsim(q, documents) for q in queries])
    np.testing.assert_allclose(ours, expected, rtol=1e-5, atol=1e-5)


def test_info_says_multivector(colbert_dir: Path) -> None:
    info = read_model_info(colbert_dir)
    assert (info.task, info.dimension, info.normalize) == ("multivector", 16, True)
    assert info.multivector is not None and info.multivector.similarity == "maxsim"
    assert info.multivector.skiplist_tasks == ("document",) and len(info.multivector.skiplist_ids) == 32


@pytest.mark.parametrize("edit,message", [
    (("sentence_bert_config.json", {"query_expansion": {"strategy": "fixed", "attend": False, "length": 600}}),
     "query_expansion length 600 exceeds the model's 512 positions"),
    (("sentence_bert_config.json", {"query_expansion": {"strategy": "fixed", "length": 32}, "query_length": 16}),
     "query_length 16 is smaller than the expansion length 32"),
    (("sentence_bert_config.json", {"query_expansion": {"strategy": "fixed", "length": 32, "token": "zzqx"}}),
     "token 'zzqx' is not one token of the model's vocabulary"),
    (("sentence_bert_config.json", {"document_length": 0}), "document_length must be a positive integer"),
    # PyLate's layout (tests/test_colbert_folders.py) lists no MultiVectorMask.
    (("config_sentence_transformers.json", {"model_type": "ColBERT"}),
     "module 'MultiVectorMask' is not supported in a PyLate ColBERT model"),
])
def test_what_is_not_served_fails_at_load_saying_why(tmp_path: Path, colbert_dir: Path, edit, message) -> None:
    directory = tmp_path / "edited"
    shutil.copytree(colbert_dir, directory)
    name, fields = edit
    path = directory / name
    path.write_text(json.dumps({**json.loads(path.read_text()), **fields}))
    with pytest.raises(ModelLoadError, match=message):
        read_model_info(directory)


def test_replica_embed_tokens_over_grpc(colbert_dir: Path, reference) -> None:
    """The replica's EmbedTokens, documents and queries (in the batch class), against
    MultiVectorEncoder; a multi-vector model refuses Embed naming its task."""
    import grpc

    from embedserve import ragged
    from embedserve.link import wire
    from embedserve.protos import inference_pb2
    from embedserve.scheduler.settings import SchedulerSettings
    from scheduler_harness import ThreadedScheduler

    def packed(texts: list[str], task: str) -> inference_pb2.PackedTokens:
        ids = [reference.tokenizer(MULTIVECTOR_PROMPTS[task] + t)["input_ids"] for t in texts]
        return wire.pack_tokens(ragged.from_sequences(ids))

    def split(reply) -> list[np.ndarray]:
        counts = wire.tensor_to_array(reply.counts)
        vectors = wire.tensor_to_array(reply.vectors)
        ends = np.cumsum(counts)
        return [vectors[a:b] for a, b in zip(ends - counts, ends, strict=True)]

    settings = SchedulerSettings(model_dir=colbert_dir, max_batch_tokens=4096, metrics_port=0)
    with Engine.load(colbert_dir) as engine:
        server = ThreadedScheduler(settings, engine)
        try:
            docs = server.stub.EmbedTokens(inference_pb2.EmbedTokensRequest(
                tokens=packed(DOCS, "document"), priority=inference_pb2.PRIORITY_BATCH), timeout=60)
            queries = server.stub.EmbedTokens(inference_pb2.EmbedTokensRequest(
                tokens=packed(QUERIES, "query"), query=True), timeout=60)
            with pytest.raises(grpc.RpcError) as refused:
                server.stub.Embed(inference_pb2.EmbedRequest(tokens=packed(DOCS, "document")), timeout=60)
        finally:
            server.close()
    for ours, expected in ((split(docs), reference.encode_document(DOCS)),
                           (split(queries), reference.encode_query(QUERIES))):
        for mine, theirs in zip(ours, expected, strict=True):
            theirs = theirs.numpy()
            assert mine.shape == theirs.shape
            assert ((mine * theirs).sum(-1) / np.linalg.norm(theirs, axis=-1)).min() >= 0.99999
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "'multivector'" in refused.value.details()


def test_bulk_embed_writes_a_list_of_token_vectors_per_row(tmp_path: Path, colbert_dir: Path, reference) -> None:
    """``embedserve embed`` on a multi-vector model: the ``embedding`` column is
    list<list<float32>>, each row its document's token vectors (document marker and
    skiplist); a .npy output is refused before the model loads."""
    import os
    import subprocess
    import sys

    import pyarrow as pa
    import pyarrow.parquet as pq

    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"text": t}) + "\n" for t in DOCS))
    root = Path(__file__).resolve().parents[1]

    def embed(output: Path) -> subprocess.CompletedProcess:
        argv = [sys.executable, "-m", "embedserve.cli", "embed", str(corpus), "-o", str(output),
                "--model", str(colbert_dir), "--dtype", "float32", "--no-progress"]
        return subprocess.run(argv, cwd=root, capture_output=True, text=True, timeout=300,
                              env={**os.environ, "PYTHONPATH": str(root)})

    done = embed(tmp_path / "out.parquet")
    assert done.returncode == 0, done.stderr
    table = pq.read_table(tmp_path / "out.parquet")
    assert table.column_names == ["id", "embedding", "tokens", "truncated", "chunked"]
    assert table.schema.field("embedding").type == pa.list_(pa.list_(pa.float32()))
    for row, theirs in zip(table.column("embedding").to_pylist(), reference.encode_document(DOCS), strict=True):
        mine, theirs = np.array(row, dtype=np.float32), theirs.numpy()
        assert mine.shape == theirs.shape
        assert ((mine * theirs).sum(-1) / np.linalg.norm(theirs, axis=-1)).min() >= 0.99999
    refused = embed(tmp_path / "out.npy")
    assert refused.returncode == 2 and "Parquet list columns" in refused.stderr


def _edited(tmp_path: Path, colbert_dir: Path, **fields) -> Path:
    """``colbert_dir`` with ``fields`` set in its Transformer's sentence_bert_config.json."""
    directory = tmp_path / "edited"
    shutil.copytree(colbert_dir, directory)
    path = directory / "sentence_bert_config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), **fields}))
    return directory


# Longer than the expansion length below: "fixed" cuts it, "min" keeps it whole.
LONG_QUERY = "what is the tallest tower in paris and when was it built by whom and why"


@pytest.mark.parametrize("strategy,attend", [("fixed", False), ("fixed", True), ("min", False)])
def test_query_expansion_equals_multivector_encoder(tmp_path: Path, colbert_dir: Path, strategy: str,
                                                    attend: bool) -> None:
    """Queries padded with [MASK] to the expansion length: the same token count (all the
    expansion positions scored) and per-token cosine >= 0.99999, whether the encoder
    attends to those positions or (classic ColBERT) not; "fixed" also caps queries at the
    length, "min" lets a long one through; documents are unchanged."""
    from sentence_transformers import MultiVectorEncoder

    from embedserve.model.multivector import expand_queries

    directory = _edited(tmp_path, colbert_dir, query_expansion={"strategy": strategy, "attend": attend,
                                                                "length": 16})
    reference = MultiVectorEncoder(str(directory), device="cpu")
    info = read_model_info(directory)
    spec = info.multivector
    assert spec is not None and spec.expansion is not None and spec.expansion.token_id == 103   # [MASK]
    limit = spec.input_limit("query", info.max_positions)
    assert limit == (16 if strategy == "fixed" else 512)
    texts = [*QUERIES, LONG_QUERY]
    ids = [reference.tokenizer(MULTIVECTOR_PROMPTS["query"] + t, truncation=True, max_length=limit)["input_ids"]
           for t in texts]
    expanded, keys = expand_queries(Batch.from_sequences(ids, "multivector"), spec.expansion)
    assert (keys is None) == attend
    doc_batch = Batch.from_sequences(
        [reference.tokenizer(MULTIVECTOR_PROMPTS["document"] + t)["input_ids"] for t in DOCS], "multivector")
    with Engine.load(directory) as engine:
        rows = engine.step(Batch.of(expanded, "multivector", key_lengths=keys)).wait()
        documents = engine.step(doc_batch).wait()
    counts, vectors = token_vectors(rows, expanded.token_ids, expanded.cu_seqlens, spec, info.normalize, "query")
    ends = np.cumsum(counts)
    ours = [vectors[a:b] for a, b in zip(ends - counts, ends, strict=True)]
    expected = [e.numpy() for e in reference.encode_query(texts)]
    assert_same_token_vectors(ours, expected, labels=texts)
    assert [len(v) for v in ours[:2]] == [16, 16]
    assert len(ours[2]) == (16 if strategy == "fixed" else len(ids[2]))
    counts, vectors = token_vectors(documents, doc_batch.token_ids, doc_batch.cu_seqlens, spec, info.normalize,
                                    "document")
    assert counts.tolist() == [len(e) for e in reference.encode_document(DOCS)]


def test_bulk_queries_are_expanded(tmp_path: Path, colbert_dir: Path) -> None:
    """The bulk embedder's query side (``--input-type query``) expands queries as a
    replica does: MultiVectorEncoder's encode_query, a long query cut at the length."""
    from sentence_transformers import MultiVectorEncoder

    from embedserve.local.embedder import LocalEmbedder
    from embedserve.local.options import EmbedOptions

    directory = _edited(tmp_path, colbert_dir, query_expansion={"strategy": "fixed", "length": 16})
    texts = [*QUERIES, LONG_QUERY]
    expected = [e.numpy() for e in MultiVectorEncoder(str(directory), device="cpu").encode_query(texts)]
    embedder = LocalEmbedder(directory, EmbedOptions(input_type="query", long_inputs="truncate"), dtype="float32")
    try:
        part = embedder.embed(texts)
    finally:
        embedder.engine.close()
    assert part.token_vectors is not None and part.token_vectors.counts.tolist() == [16, 16, 16]
    ends = np.cumsum(part.token_vectors.counts)
    for (a, b), theirs in zip(zip(ends - 16, ends, strict=True), expected, strict=True):
        mine = part.token_vectors.vectors[a:b]
        assert ((mine * theirs).sum(-1) / np.linalg.norm(theirs, axis=-1)).min() >= 0.99999
