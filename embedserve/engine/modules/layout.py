"""Per-token bookkeeping derived from ``cu_seqlens``: positions, sequence ids.

Owns turning a packed batch's ``cu_seqlens [B+1]`` into the index tensors the
forward pass needs (position ids that restart per sequence, the sequence each
token belongs to, its offset inside that sequence). Computed once per step on the host with NumPy.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch


@dataclass(frozen=True)
class PackedLayout:
    cu_seqlens: np.ndarray         # int32 [B+1]
    seq_ids: np.ndarray            # int64 [T]: which sequence each token is in
    offsets: np.ndarray            # int64 [T]: index of the token inside its sequence
    seq_ids_tensor: torch.Tensor   # the same on the compute device
    offsets_tensor: torch.Tensor
    lengths_tensor: torch.Tensor   # int64 [B]

    @property
    def num_sequences(self) -> int:
        return int(self.cu_seqlens.shape[0] - 1)

    @property
    def starts(self) -> list[int]:
        return self.cu_seqlens[:-1].tolist()

    @property
    def ends(self) -> list[int]:
        return self.cu_seqlens[1:].tolist()

    @property
    def max_length(self) -> int:
        return int(np.diff(self.cu_seqlens).max())


def layout_arrays(cu_seqlens: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(seq_ids [T], offsets [T]) for a packed batch."""
    lengths = np.diff(cu_seqlens).astype(np.int64)
    seq_ids = np.repeat(np.arange(lengths.shape[0], dtype=np.int64), lengths)
    offsets = np.arange(int(cu_seqlens[-1]), dtype=np.int64) - np.repeat(
        cu_seqlens[:-1].astype(np.int64), lengths)
    return seq_ids, offsets


def bounds_from_offsets(offsets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(starts [B], lengths [B]), int64 on the host, of the sequences of a packed step
    known only by its offsets ``[T]`` (0 at each sequence's first token): what the
    families that build their attention from the position ids (MPNet, DeBERTa,
    ModernBERT's windows) need. Reads the offsets on the host (a sync on CUDA)."""
    starts = torch.nonzero(offsets == 0).flatten().cpu()
    return starts, torch.diff(starts, append=torch.tensor([offsets.shape[0]]))


def build_layout(cu_seqlens: np.ndarray, device: torch.device | str = "cpu") -> PackedLayout:
    seq_ids, offsets = layout_arrays(cu_seqlens)
    lengths = np.diff(cu_seqlens).astype(np.int64)
    return PackedLayout(cu_seqlens, seq_ids, offsets,
                        torch.from_numpy(seq_ids).to(device), torch.from_numpy(offsets).to(device),
                        torch.from_numpy(lengths).to(device))
