"""A sparse model's answer as the gateway holds it: each input's (indices, values).

Owns turning the replicas' flat nonzeros (counts, indices, values; dispatch.py joins
chunks by concatenation) back into one pair of arrays per input, and the long-input
rule sparse routes share. Used by routes/sparse.py and /v1/embeddings' sparse option.
"""

from __future__ import annotations

import numpy as np
from starlette.requests import Request

from embedserve.errors import InvalidInput
from embedserve.gateway.long_inputs import LongInputPolicy
from embedserve.gateway.pipeline import Gateway
from embedserve.ragged import RaggedBatch


def check_sparse_policy(policy: LongInputPolicy) -> None:
    if policy.mode == "chunk":
        raise InvalidInput("truncate='chunk' is not available for a sparse model; send "
                           "truncate=true or shorter inputs", field="truncate")


def split_rows(counts: np.ndarray, indices: np.ndarray,
               values: np.ndarray) -> list[tuple[np.ndarray, np.ndarray]]:
    """Flat nonzeros -> each input's (indices, values)."""
    ends = np.cumsum(counts)
    starts = ends - counts
    return [(indices[a:b], values[a:b]) for a, b in zip(starts.tolist(), ends.tolist())]


async def sparse_vectors(gateway: Gateway, request: Request, packed: RaggedBatch, top_k: int | None,
                         route: str) -> list[tuple[np.ndarray, np.ndarray]]:
    counts, indices, values = await gateway.embed_sparse(request, packed, top_k, route)
    return split_rows(counts, indices, values)
