"""Per-request post-processing of engine outputs, in NumPy.

The engine returns raw pooled vectors and raw logits for a whole batch; the
scheduler applies these per call, because normalization, Matryoshka
dimensions and sigmoid are request options, not model state.
"""

from __future__ import annotations

import numpy as np

from embedserve import validate
from embedserve.errors import InvalidInput


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
