"""PyLate and Stanford-NLP (colbert-ai) ColBERT folders in the engine, against PyLate.

On tiny random BERT ColBERTs written in each layout (tests/task_models.py: PyLate's
``ColBERT.save`` layout with ``[unused0]`` / ``[unused1]`` or added ``[Q] `` / ``[D] ``
markers, and colbert-ai's ``HF_ColBERT`` checkpoint with ``artifact.metadata``), and a
PyLate one over a tiny ModernBERT (tests/modernbert_model.py): the
engine's token vectors, after the marker insertion and query expansion a replica applies
(``model/multivector.prepare_inputs``) and its skiplist and normalization
(``model/postprocess.token_vectors``), have PyLate's token count and a per-token cosine of
at least 0.99999 (float32), for queries (expanded with [MASK], attended or not, or not
expanded) and documents; MaxSim equals ``pylate.scores.colbert_scores``. The reference is
PyLate 1.6.0's algorithm on transformers (tests/pylate_reference.py: PyLate itself does
not run beside sentence-transformers 6); for the Stanford folder sentence-transformers'
MultiVectorEncoder, which converts such checkpoints, is a second one. What neither would
score alike is refused at load with its reason. Through ``embedserve serve``:
tests/test_tasks_serve.py.
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
from embedserve.model.multivector import prepare_inputs
from embedserve.model.postprocess import token_vectors
from modernbert_model import build_tiny_modernbert
from pylate_reference import PyLateReference, colbert_scores
from task_models import build_pylate, build_stanford_colbert
from token_vectors import assert_same_token_vectors

# The last query is longer than the query length (12): cut to it.
QUERIES = ["What is the capital of France?", "bananas!",
           "what is the tallest tower in paris and when was it built by whom and why"]
# Punctuation the skiplist drops; the last is longer than the document length (20).
DOCS = ["Paris is the capital of France.", "Bananas are yellow; apples (mostly) are red!", "x",
        "The Eiffel tower, in Paris, is 330 m tall; it was built for the 1889 World's Fair by Gustave Eiffel."]

VARIANTS = {
    "pylate": dict(kind="pylate"),
    "pylate-added-markers": dict(kind="pylate", query_prefix="[Q] ", document_prefix="[D] ", model_type=None),
    "pylate-attended": dict(kind="pylate", attend_to_expansion_tokens=True),
    "pylate-no-expansion": dict(kind="pylate", do_query_expansion=False),
    # GTE-ModernColBERT's shape: a ModernBERT (local window 8, so the expansion's key limit
    # and the window meet in its local layers), a BPE tokenizer, added [Q] / [D] markers.
    "pylate-modernbert": dict(kind="pylate-modernbert", query_prefix="[Q] ", document_prefix="[D] ",
                              query_length=20, document_length=24),
    "stanford": dict(kind="stanford"),
    "stanford-attended": dict(kind="stanford", attend_to_mask_tokens=True),
    "stanford-pickled": dict(kind="stanford", pickled=True),     # pytorch_model.bin
}


def build(directory: Path, tokenizer_dir: Path, kind: str, **options) -> Path:
    if kind == "stanford":
        return build_stanford_colbert(directory, tokenizer_dir, seed=11, **options)
    if kind == "pylate-modernbert":
        backbone = build_tiny_modernbert(directory.parent / f"{directory.name}-backbone", seed=13)
        return build_pylate(directory, tokenizer_dir, seed=12, backbone=backbone, **options)
    return build_pylate(directory, tokenizer_dir, seed=12, **options)


@pytest.fixture(scope="module", params=sorted(VARIANTS))
def folder(request, tmp_path_factory, minilm_dir) -> Path:
    return build(tmp_path_factory.mktemp(request.param) / request.param, minilm_dir, **VARIANTS[request.param])


def ours(folder: Path, engine: Engine, texts: list[str], task: str) -> list[np.ndarray]:
    """The engine's vectors for ``texts``, tokenized by the model's tokenizer as the gateway
    does (capped at the spec's input limit), prepared as a replica prepares them."""
    import transformers

    info = engine.info
    spec = info.multivector
    assert spec is not None
    tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
    limit = spec.input_limit(task, info.max_positions)
    ids = [tokenizer(text, truncation=True, max_length=limit)["input_ids"] for text in texts]
    prepared, keys = prepare_inputs(Batch.from_sequences(ids, "multivector"), spec, task)
    rows = engine.step(Batch.of(prepared, "multivector", key_lengths=keys)).wait()
    counts, vectors = token_vectors(rows, prepared.token_ids, prepared.cu_seqlens, spec, info.normalize, task)
    ends = np.cumsum(counts)
    return [vectors[a:b] for a, b in zip(ends - counts, ends, strict=True)]


def test_token_vectors_and_maxsim_equal_pylate(folder: Path) -> None:
    reference = PyLateReference(folder)
    with Engine.load(folder) as engine:
        queries = ours(folder, engine, QUERIES, "query")
        documents = ours(folder, engine, DOCS, "document")
    expected_queries = reference.encode(QUERIES, is_query=True)
    expected_documents = reference.encode(DOCS, is_query=False)
    assert_same_token_vectors(queries, expected_queries, labels=QUERIES)
    assert_same_token_vectors(documents, expected_documents, labels=DOCS)
    if reference.do_query_expansion:       # every query padded to (or cut at) the query length
        assert [len(q) for q in queries] == [reference.query_length] * 3
    assert len(documents[3]) < reference.document_length     # cut there, punctuation dropped
    expected = colbert_scores(expected_queries, expected_documents)
    np.testing.assert_allclose(np.stack([maxsim(q, documents) for q in queries]), expected, rtol=1e-5, atol=1e-5)


def test_stanford_folder_equals_sentence_transformers_too(tmp_path: Path, minilm_dir: Path) -> None:
    """sentence-transformers' MultiVectorEncoder converts a Stanford-NLP checkpoint itself
    (markers as special-token prompts, ``artifact.metadata``'s lengths and expansion)."""
    from sentence_transformers import MultiVectorEncoder

    folder = build(tmp_path / "stanford", minilm_dir, kind="stanford")
    reference = MultiVectorEncoder(str(folder), device="cpu")
    with Engine.load(folder) as engine:
        queries = ours(folder, engine, QUERIES, "query")
        documents = ours(folder, engine, DOCS, "document")
    assert_same_token_vectors(queries, [e.numpy() for e in reference.encode_query(QUERIES)], labels=QUERIES)
    assert_same_token_vectors(documents, [e.numpy() for e in reference.encode_document(DOCS)], labels=DOCS)


def test_info_reads_each_layout(tmp_path: Path, minilm_dir: Path) -> None:
    stanford = read_model_info(build(tmp_path / "stanford", minilm_dir, kind="stanford"))
    pylate = read_model_info(build(tmp_path / "pylate", minilm_dir, kind="pylate", query_prefix="[Q] ",
                                   document_prefix="[D] "))
    for info in (stanford, pylate):
        spec = info.multivector
        assert (info.task, info.dimension, info.normalize) == ("multivector", 16, True)
        assert spec is not None and spec.expansion is not None
        assert (spec.expansion.length, spec.expansion.token_id, spec.query_length, spec.document_length) == \
            (12, 103, 12, 20)
        assert spec.input_limit("query", 512) == 11 and spec.input_limit("document", 512) == 19
    assert stanford.architecture == "HF_ColBERT"
    assert (stanford.multivector.query_marker_id, stanford.multivector.document_marker_id) == (1, 2)  # type: ignore[union-attr]
    assert (pylate.multivector.query_marker_id, pylate.multivector.document_marker_id) == (30522, 30523)  # type: ignore[union-attr]


def _edit(path: Path, **fields) -> None:
    path.write_text(json.dumps({**json.loads(path.read_text()), **fields}))


@pytest.mark.parametrize("kind,file,fields,message", [
    ("stanford", "artifact.metadata", {"mask_punctuation": False}, "mask_punctuation false is not supported"),
    ("stanford", "artifact.metadata", {"similarity": "l2"}, "similarity 'l2' is not supported"),
    ("stanford", "config.json", {"model_type": "xlm-roberta"}, "HF_ColBERT.*'xlm-roberta' backbone is not supported"),
    ("pylate", "config_sentence_transformers.json", {"query_prefix": "[QUERY] "},
     r"query prefix '\[QUERY\] ' is not a token of the model's tokenizer"),
    ("pylate", "config_sentence_transformers.json", {"document_length": 0}, "document length must be a positive"),
    ("pylate", "1_Dense/config.json", {"use_residual": True}, "use_residual is not supported"),
    ("pylate", "modules.json", None, "module 'Pooling' is not supported in a PyLate ColBERT model"),
])
def test_what_is_not_served_fails_at_load_saying_why(tmp_path: Path, minilm_dir: Path, kind: str, file: str,
                                                      fields, message: str) -> None:
    folder = build(tmp_path / kind, minilm_dir, kind=kind)
    if fields is None:   # a module PyLate's ColBERT never lists
        modules = json.loads((folder / file).read_text())
        modules.append({"idx": 2, "name": "2", "path": "2_Pooling",
                        "type": "sentence_transformers.models.Pooling"})
        (folder / file).write_text(json.dumps(modules))
        (folder / "2_Pooling").mkdir()
        (folder / "2_Pooling" / "config.json").write_text(json.dumps({"pooling_mode_mean_tokens": True}))
    else:
        _edit(folder / file, **fields)
    with pytest.raises(ModelLoadError, match=message):
        read_model_info(folder)


def test_a_stanford_checkpoint_without_metadata_uses_pylate_defaults(tmp_path: Path, minilm_dir: Path) -> None:
    folder = build(tmp_path / "stanford", minilm_dir, kind="stanford")
    (folder / "artifact.metadata").unlink()
    spec = read_model_info(folder).multivector
    assert spec is not None and spec.expansion is not None
    assert (spec.query_marker_id, spec.document_marker_id, spec.expansion.length, spec.document_length) == \
        (1, 2, 32, 180)
    shutil.rmtree(folder)


def test_bulk_embedder_inserts_the_markers(tmp_path: Path, minilm_dir: Path) -> None:
    """The bulk embedder (``embedserve embed --input-type query``) prepares a PyLate
    folder's queries as a replica does (marker, then expansion): PyLate's vectors."""
    from embedserve.local.embedder import LocalEmbedder
    from embedserve.local.options import EmbedOptions

    folder = build(tmp_path / "pylate", minilm_dir, kind="pylate")
    expected = PyLateReference(folder).encode(QUERIES, is_query=True)
    embedder = LocalEmbedder(folder, EmbedOptions(input_type="query", long_inputs="truncate"), dtype="float32")
    try:
        part = embedder.embed(QUERIES)
    finally:
        embedder.engine.close()
    assert part.token_vectors is not None
    ends = np.cumsum(part.token_vectors.counts)
    ours = [part.token_vectors.vectors[a:b] for a, b in zip(ends - part.token_vectors.counts, ends, strict=True)]
    assert_same_token_vectors(ours, expected, labels=QUERIES)
