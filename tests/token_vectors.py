"""One check for per-token outputs (multi-vector models' token vectors, an embedder's
token states): the same number of tokens per input as the reference, and every token's
vector at cosine >= ``min_cosine`` to the reference's."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def assert_same_token_vectors(ours: Sequence, expected: Sequence[np.ndarray], min_cosine: float = 0.99999,
                              labels: Sequence[str] | None = None) -> None:
    """``ours[i]`` ([tokens, dim], any array-like) against ``expected[i]``; ``labels`` name
    the inputs in a failure (default: their index)."""
    assert len(ours) == len(expected)
    for i, (mine, theirs) in enumerate(zip(ours, expected, strict=True)):
        label = labels[i] if labels is not None else i
        mine = np.asarray(mine, dtype=np.float32)
        assert mine.shape == theirs.shape, (label, mine.shape, theirs.shape)
        cosine = (mine * theirs).sum(-1) / (np.linalg.norm(mine, axis=-1) * np.linalg.norm(theirs, axis=-1))
        assert cosine.min() >= min_cosine, (label, cosine.min())
