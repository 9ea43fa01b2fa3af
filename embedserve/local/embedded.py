"""EmbeddedPart: one part's finished vectors, however they were computed.

What ``LocalEmbedder.compute`` (this process), ``RemoteEmbedder.compute`` (a
gateway) and the Ray driver hand to the bulk writer. Torch-free.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass
class SparseRows:
    """A sparse model's vectors as their nonzeros: row i owns entries
    [sum(counts[:i]), sum(counts[:i+1])) of ``indices`` (ascending) and ``values``."""

    counts: np.ndarray                   # int32 [n]
    indices: np.ndarray                  # int32 [N]: vocabulary ids
    values: np.ndarray                   # float32 [N]


@dataclass
class TokenVectorRows:
    """A multi-vector model's vectors: row i owns rows [sum(counts[:i]), sum(counts[:i+1]))
    of ``vectors``, its kept tokens' vectors in token order."""

    counts: np.ndarray                   # int32 [n]
    vectors: np.ndarray                  # float32 [N, dim]


@dataclass
class EmbeddedPart:
    rows: np.ndarray                     # int64 [n]: indices into the part's texts, ascending
    stored: np.ndarray                   # [n, d] in the output precision (or [n, d/8] packed)
    tokens: np.ndarray                   # int32 [n]: embedded, specials (and every window's) included
    truncated: np.ndarray                # bool [n]
    chunked: np.ndarray                  # bool [n]: pooled from several windows
    problems: list[tuple[int, str]]
    sparse: SparseRows | None = None     # a sparse model's vectors (``stored`` is then [n, 0])
    token_vectors: TokenVectorRows | None = None   # a multi-vector model's (``stored``: [n, 0])
