"""EncodedBatch: the packed result of encoding many texts (or pairs).

One flat int32 id array plus ``cu_seqlens``, ready to go over the wire as bytes
without a copy per sequence. Sequence i is ``ids[cu_seqlens[i]:cu_seqlens[i+1]]``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class EncodedBatch:
    ids: np.ndarray  # int32 [T], specials included
    cu_seqlens: np.ndarray  # int32 [B + 1]
    truncated: np.ndarray  # bool [B]: tokens were cut to fit max_length
    original_lengths: np.ndarray  # int32 [B]: length (specials included) before truncation
    offsets: np.ndarray | None = None  # int32 [T, 2]: [start, end) characters; specials (0, 0)

    def __len__(self) -> int:
        return int(self.cu_seqlens.shape[0] - 1)

    @property
    def lengths(self) -> np.ndarray:
        return np.diff(self.cu_seqlens)

    def sequence(self, i: int) -> np.ndarray:
        return self.ids[self.cu_seqlens[i]:self.cu_seqlens[i + 1]]

    def sequence_offsets(self, i: int) -> np.ndarray:
        if self.offsets is None:
            raise ValueError("encoded without return_offsets=True")
        return self.offsets[self.cu_seqlens[i]:self.cu_seqlens[i + 1]]
