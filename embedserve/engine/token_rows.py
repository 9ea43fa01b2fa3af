"""Per-sequence token answers, and splitting a step whose calls asked for different outputs.

The batcher hands each call its rows by sequence (``rows[a:b]``), so a step that returns
token vectors splits them by ``cu_seqlens`` into a 1-D object array of ``[L_i, dim]``
float32 arrays: sliced, placed and counted like any other step's rows. That is a
multi-vector model's answer (its projected token vectors), and the token-state half of an
embedding step that some call asked last hidden states of (``Batch.token_states``): such a
step's rows are an object array ``[B, 2]``, each row its pooled vector and its token
states, and ``call_rows`` gives each call the half it asked for.
"""

from __future__ import annotations

import numpy as np

POOLED, STATES = 0, 1   # the columns of a token-state step's rows


def token_rows(tokens: np.ndarray, cu_seqlens: np.ndarray) -> np.ndarray:
    """tokens [T', dim] (T' >= cu_seqlens[-1]: a bucket's padding follows) -> object [B]."""
    rows = np.empty(cu_seqlens.shape[0] - 1, dtype=object)
    for i, (start, end) in enumerate(zip(cu_seqlens[:-1].tolist(), cu_seqlens[1:].tolist(), strict=True)):
        rows[i] = tokens[start:end]
    return rows


def pooled_and_states(pooled: np.ndarray, states: np.ndarray, cu_seqlens: np.ndarray) -> np.ndarray:
    """pooled [B', dim] (B' >= B), states [T', hidden] -> object [B, 2]: per sequence its
    pooled vector and its [L_i, hidden] token states."""
    sequences = cu_seqlens.shape[0] - 1
    rows = np.empty((sequences, 2), dtype=object)
    rows[:, STATES] = token_rows(states, cu_seqlens)
    for i in range(sequences):
        rows[i, POOLED] = pooled[i]
    return rows


def is_token_state_step(rows: np.ndarray) -> bool:
    """Whether a step's rows are ``pooled_and_states``' pairs."""
    return rows.ndim == 2 and rows.dtype == object


def call_rows(rows: np.ndarray, token_states: bool) -> np.ndarray:
    """A call's slice of a step's rows, as the call asked: unchanged for an ordinary step;
    for a token-state step, the object [n] token states, or the pooled rows stacked [n, dim]."""
    if not is_token_state_step(rows):
        return rows
    if token_states:
        return rows[:, STATES]
    return np.stack(list(rows[:, POOLED]))
