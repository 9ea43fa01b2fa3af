"""EncodedBatch: the tokenizer's result for many texts (or pairs).

A ``RaggedBatch`` (flat int32 ids plus ``cu_seqlens``, ready to go over the
wire as bytes without a copy per sequence) that also carries what only the
tokenizer knows: which sequences were cut, their lengths before the cut, and
optionally each token's character span.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from embedserve.ragged import RaggedBatch


@dataclass(frozen=True, kw_only=True)
class EncodedBatch(RaggedBatch):
    truncated: np.ndarray  # bool [B]: tokens were cut to fit max_length
    original_lengths: np.ndarray  # int32 [B]: length (specials included) before truncation
    offsets: np.ndarray | None = None  # int32 [T, 2]: [start, end) characters; specials (0, 0)

    def __len__(self) -> int:
        return self.num_sequences

    def sequence_offsets(self, i: int) -> np.ndarray:
        if self.offsets is None:
            raise ValueError("encoded without return_offsets=True")
        return self.offsets[self.cu_seqlens[i]:self.cu_seqlens[i + 1]]
