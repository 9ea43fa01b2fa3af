"""RaggedBatch: B token sequences of different lengths, packed without padding.

The one batch type every tier passes on: the tokenizer's result
(``EncodedBatch``) is one, the gateway slices one into chunks, the wire
carries one (as lengths), the scheduler queues one per call and the engine's
``Batch`` is one plus the task. Sequence i is
``token_ids[cu_seqlens[i]:cu_seqlens[i + 1]]``, as in FlashAttention's varlen
API and TEI's ``cu_seq_lengths``.

Owns the layout only. Whether a batch is well formed, or fits a model, is
``embedserve.validate``'s question; this module never raises.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class RaggedBatch:
    token_ids: np.ndarray                     # int32 [T], specials included
    cu_seqlens: np.ndarray                    # int32 [B+1]: 0, then each sequence's end
    token_type_ids: np.ndarray | None = None  # int32 [T] segment ids; None means all zeros

    @property
    def num_sequences(self) -> int:
        return int(self.cu_seqlens.shape[0] - 1)

    @property
    def num_tokens(self) -> int:
        return int(self.token_ids.shape[0])

    @property
    def lengths(self) -> np.ndarray:
        """int32 [B]: tokens per sequence."""
        cu_seqlens = self.cu_seqlens
        return cu_seqlens[1:] - cu_seqlens[:-1]   # np.diff's result, without its Python wrapper

    def sequence(self, i: int) -> np.ndarray:
        """The ids of sequence ``i`` (a view)."""
        return self.token_ids[self.cu_seqlens[i]:self.cu_seqlens[i + 1]]

    def slice(self, start: int, stop: int) -> RaggedBatch:
        """Sequences [start, stop) as their own batch (views of the same ids)."""
        lo, hi = int(self.cu_seqlens[start]), int(self.cu_seqlens[stop])
        return RaggedBatch(self.token_ids[lo:hi], self.cu_seqlens[start:stop + 1] - lo,
                           None if self.token_type_ids is None else self.token_type_ids[lo:hi])


def cu_seqlens_from_lengths(lengths: np.ndarray) -> np.ndarray:
    """int64 [B+1]: 0, then the running sum of ``lengths`` (int64, so a sum cannot wrap)."""
    cu_seqlens = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(lengths, out=cu_seqlens[1:])
    return cu_seqlens


def from_lengths(token_ids: np.ndarray, lengths: np.ndarray,
                 token_type_ids: np.ndarray | None = None) -> RaggedBatch:
    """A batch from flat ids and per-sequence lengths, as int32 arrays."""
    return RaggedBatch(np.ascontiguousarray(token_ids, dtype=np.int32),
                       cu_seqlens_from_lengths(lengths).astype(np.int32),
                       None if token_type_ids is None
                       else np.ascontiguousarray(token_type_ids, dtype=np.int32))


def from_sequences(sequences: Sequence[np.ndarray] | Sequence[Sequence[int]]) -> RaggedBatch:
    """A batch from one id list (or array) per sequence."""
    arrays = [np.asarray(s, dtype=np.int32) for s in sequences]
    lengths = np.array([a.shape[0] for a in arrays], dtype=np.int64)
    ids = np.concatenate(arrays) if arrays else np.zeros(0, dtype=np.int32)
    return from_lengths(ids, lengths)
