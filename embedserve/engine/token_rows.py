"""A multi-vector step's answer: one row per sequence, each row that sequence's token vectors.

The batcher hands each call its rows by sequence (``rows[a:b]``), so a multi-vector
step's ``[T, dim]`` token vectors are split by ``cu_seqlens`` into a 1-D object array
of ``[L_i, dim]`` float32 arrays: sliced, placed and counted like any other step's rows.
"""

from __future__ import annotations

import numpy as np


def token_rows(tokens: np.ndarray, cu_seqlens: np.ndarray) -> np.ndarray:
    """tokens [T', dim] (T' >= cu_seqlens[-1]: a bucket's padding follows) -> object [B]."""
    rows = np.empty(cu_seqlens.shape[0] - 1, dtype=object)
    for i, (start, end) in enumerate(zip(cu_seqlens[:-1].tolist(), cu_seqlens[1:].tolist(), strict=True)):
        rows[i] = tokens[start:end]
    return rows
