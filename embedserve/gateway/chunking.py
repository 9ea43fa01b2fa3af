"""Cut a tokenized request into chunks bounded in sequences and tokens.

A pure function over sequence lengths; knows nothing about replicas or gRPC.
Chunks are contiguous index ranges so that answers are put back in input
order by concatenation.
"""

from __future__ import annotations

import numpy as np


def plan_chunks(lengths: np.ndarray, max_sequences: int, max_tokens: int) -> list[tuple[int, int]]:
    """Split ``lengths`` [B] into contiguous ranges ``[start, stop)``.

    Each range holds at most ``max_sequences`` sequences and at most
    ``max_tokens`` tokens, except that a single sequence longer than
    ``max_tokens`` forms a range of its own (it cannot be split). The ranges
    cover ``0..B`` exactly once, in order.
    """
    if max_sequences < 1 or max_tokens < 1:
        raise ValueError("chunk bounds must be positive")
    chunks: list[tuple[int, int]] = []
    start = 0
    tokens = 0
    for i, length in enumerate(np.asarray(lengths, dtype=np.int64).tolist()):
        full = (i - start) >= max_sequences or (i > start and tokens + length > max_tokens)
        if full:
            chunks.append((start, i))
            start, tokens = i, 0
        tokens += length
    if start < len(lengths):
        chunks.append((start, len(lengths)))
    return chunks
