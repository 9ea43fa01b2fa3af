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
