"""Per-request post-processing of engine outputs, in NumPy.

The engine returns raw pooled vectors and raw logits for a whole batch; the
scheduler applies these per call, because normalization, Matryoshka
dimensions and sigmoid are request options, not model state.
"""

from __future__ import annotations

import numpy as np

from embedserve import validate
from embedserve.errors import InvalidInput
from embedserve.model.multivector import MultiVectorSpec


def postprocess_embeddings(vectors: np.ndarray, normalize: bool,
                           dimensions: int | None = None) -> np.ndarray:
    """Matryoshka truncation to ``dimensions``, then optional L2 normalization.

    vectors: float32 [B, dim] -> float32 [B, d]. Truncation comes first so a
    truncated vector is renormalized at its own length, as sentence-transformers
    does with ``truncate_dim``. A zero vector stays zero instead of becoming NaN.
    """
    if vectors.ndim != 2:
        raise InvalidInput(f"expected [B, dim] vectors, got shape {vectors.shape}")
    if dimensions is not None:
        validate.check_dimensions(dimensions, vectors.shape[1])
        vectors = vectors[:, :dimensions]
    vectors = np.ascontiguousarray(vectors, dtype=np.float32)
    if normalize:
        norms = np.linalg.norm(vectors, axis=1, keepdims=True)
        vectors = vectors / np.maximum(norms, np.float32(1e-12))
    return vectors.astype(np.float32, copy=False)


def sigmoid(logits: np.ndarray) -> np.ndarray:
    """Numerically stable logistic function, float32 in and out."""
    x = np.asarray(logits, dtype=np.float64)
    out = np.empty_like(x)
    positive = x >= 0
    out[positive] = 1.0 / (1.0 + np.exp(-x[positive]))
    e = np.exp(x[~positive])
    out[~positive] = e / (1.0 + e)
    return out.astype(np.float32)


def postprocess_scores(logits: np.ndarray, apply_sigmoid: bool) -> np.ndarray:
    """Raw logits [B] -> scores [B]; sigmoid maps them into (0, 1)."""
    scores = np.asarray(logits, dtype=np.float32)
    return sigmoid(scores) if apply_sigmoid else scores


def classification_probabilities(logits: np.ndarray, activation: str) -> np.ndarray:
    """A classifier's logits [B, labels] -> probabilities: "softmax" over the labels (one
    label per input, transformers' single_label_classification) or "sigmoid" per label
    (multi_label_classification). Computed in float64, returned float32."""
    x = np.asarray(logits, dtype=np.float64)
    if activation == "sigmoid":
        return sigmoid(x)
    if activation != "softmax":
        raise InvalidInput(f"unknown classifier activation {activation!r}")
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return (e / e.sum(axis=-1, keepdims=True)).astype(np.float32)


def sparse_rows(rows: np.ndarray, top_k: int | None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """SPLADE weights [B, vocab] -> their nonzeros: counts int32 [B], indices int32 [N]
    and values float32 [N], each row's entries by ascending index (as a coalesced sparse
    tensor lists them). ``top_k``: keep only each row's ``top_k`` largest weights
    (sentence-transformers' ``max_active_dims``; ties at the cut broken by lower index)."""
    rows = np.asarray(rows, dtype=np.float32)
    if rows.ndim != 2:
        raise InvalidInput(f"expected [B, vocab] sparse rows, got shape {rows.shape}")
    if top_k is not None and top_k < 1:
        raise InvalidInput(f"top_k must be at least 1, got {top_k}", field="top_k")
    if top_k is not None and top_k < rows.shape[1]:
        # Keep the top_k largest per row (stable on index for ties), zero the rest.
        order = np.argsort(-rows, axis=1, kind="stable")[:, :top_k]
        kept = np.zeros_like(rows)
        np.put_along_axis(kept, order, np.take_along_axis(rows, order, axis=1), axis=1)
        rows = kept
    row_ids, indices = np.nonzero(rows)
    counts = np.bincount(row_ids, minlength=rows.shape[0]).astype(np.int32)
    return counts, indices.astype(np.int32), rows[row_ids, indices].astype(np.float32)


def token_vectors(rows: np.ndarray, token_ids: np.ndarray, cu_seqlens: np.ndarray,
                  spec: MultiVectorSpec, normalize: bool, task: str) -> tuple[np.ndarray, np.ndarray]:
    """A multi-vector model's per-sequence token vectors (an object array of [L_i, dim],
    engine/token_rows.py) -> counts int32 [B] and the kept vectors float32 [N, dim'].

    In MultiVectorEncoder's order: the skiplist drops tokens for the tasks it names
    (``task`` "query" or "document"), Normalize L2-normalizes each token vector, then
    ``truncate_dim`` keeps the first dimensions and normalizes again."""
    skip = np.asarray(spec.skiplist_ids, dtype=np.int64) if spec.skips(task) else None
    kept: list[np.ndarray] = []
    for i, row in enumerate(rows):
        vectors = np.asarray(row, dtype=np.float32)
        if skip is not None:
            ids = token_ids[cu_seqlens[i]:cu_seqlens[i + 1]]
            vectors = vectors[~np.isin(ids, skip)]
        kept.append(vectors)
    width = kept[0].shape[1] if kept else 0
    flat = np.concatenate(kept, axis=0) if kept else np.zeros((0, width), np.float32)
    if normalize:
        flat = _l2(flat)
    if spec.truncate_dim:
        flat = _l2(flat[:, :spec.truncate_dim])
    counts = np.array([k.shape[0] for k in kept], dtype=np.int32)
    return counts, np.ascontiguousarray(flat, dtype=np.float32)


def _l2(x: np.ndarray) -> np.ndarray:
    # torch.nn.functional.normalize's eps: a zero vector stays zero.
    norms = np.maximum(np.linalg.norm(x.astype(np.float64), axis=-1, keepdims=True), 1e-12)
    return (x / norms).astype(np.float32)
