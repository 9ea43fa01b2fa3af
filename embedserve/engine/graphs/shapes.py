"""Bucket shapes: the padded (tokens, sequences) a step runs at on CUDA.

The token count is padded up to a multiple of 64 up to 1024, then of 256; the
sequence count up to a power of two. Pure arithmetic, shared by the cache
policy (``cache.py``) and the padded inputs (``buckets.py``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

TOKEN_STEP_SMALL, TOKEN_STEP_LARGE, SMALL_LIMIT = 64, 256, 1024


@dataclass(frozen=True, order=True)
class BucketKey:
    tokens: int        # padded token count
    sequences: int     # padded sequence count


def token_bucket(tokens: int) -> int:
    """Round up: multiples of 64 up to 1024, then multiples of 256."""
    step = TOKEN_STEP_SMALL if tokens <= SMALL_LIMIT else TOKEN_STEP_LARGE
    return max(step, -(-tokens // step) * step)


def sequence_bucket(sequences: int) -> int:
    """Round up to a power of two (padding rows cost one pooled row each)."""
    return 1 << max(0, (sequences - 1).bit_length())


def bucket_for(tokens: int, sequences: int) -> BucketKey:
    # A bucket never holds more sequences than tokens.
    padded_tokens = token_bucket(tokens)
    return BucketKey(padded_tokens, min(sequence_bucket(sequences), padded_tokens))


def reachable_buckets(max_tokens: int, max_sequences: int) -> list[BucketKey]:
    """Every bucket a step of at most ``max_tokens`` tokens in at most
    ``max_sequences`` sequences can map to, smallest first."""
    keys = {bucket_for(tokens, sequences)
            for tokens in _edges(max_tokens, token_bucket)
            for sequences in _edges(min(tokens, max_sequences), sequence_bucket)}
    return sorted(keys)


def _edges(limit: int, bucket: Callable[[int], int]) -> list[int]:
    """The largest count of each bucket up to ``limit`` (and ``limit`` itself)."""
    edges, count = [], 1
    while count <= limit:
        edges.append(min(bucket(count), limit))
        count = bucket(count) + 1
    return edges
