"""Packing a part's documents into engine batches: the pure rule.

Documents are sorted by length (longest first, ties in input order) inside
consecutive windows, so a batch holds sequences of similar length, then cut
front to back with the scheduler's own rule (``scheduler.policy.plan_batch``):
stop before the token budget or the sequence cap would be exceeded; a
document longer than the whole budget runs alone. The plan depends only on
the lengths it is given, never on where a run started, so a resumed job
computes every part in exactly the batches an uninterrupted one does.
"""

from __future__ import annotations

import numpy as np

from embedserve.scheduler.policy import plan_batch


def length_order(lengths: np.ndarray, window: int) -> np.ndarray:
    """int64 [B]: indices sorted longest first within each ``window`` consecutive documents."""
    if window < 1:
        raise ValueError("window must be >= 1")
    lengths = np.asarray(lengths, dtype=np.int64)
    parts = []
    for lo in range(0, len(lengths), window):
        chunk = lengths[lo:lo + window]
        parts.append(lo + np.argsort(-chunk, kind="stable"))
    return np.concatenate(parts) if parts else np.zeros(0, np.int64)


def plan_batches(lengths: np.ndarray, token_budget: int, max_sequences: int,
                 window: int) -> list[np.ndarray]:
    """The batches for documents of ``lengths``: one int64 index array per batch.

    Every index appears in exactly one batch; a batch's tokens stay within
    ``token_budget`` unless it is one document longer than the budget.
    """
    order = length_order(lengths, window)
    lengths = np.asarray(lengths, dtype=np.int64)
    batches: list[np.ndarray] = []
    pos = 0
    while pos < len(order):
        # plan_batch reads at most max_sequences + 1 entries; hand it no more.
        front = order[pos:pos + max_sequences + 1].tolist()
        plan = plan_batch(front, token_budget, max_sequences, lambda i: int(lengths[i]), lambda i: None)
        batches.append(np.asarray(plan.taken, dtype=np.int64))
        pos += plan.consumed
    return batches
