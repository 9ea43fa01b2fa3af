"""Pooling token states into one vector per sequence of a packed batch."""

from __future__ import annotations

import torch


def mean_pool(hidden: torch.Tensor, seq_ids: torch.Tensor, lengths: torch.Tensor,
              num_rows: int) -> torch.Tensor:
    """Mean of each sequence's token states.

    hidden: [T, H]; seq_ids: [T] in [0, num_rows); lengths: [num_rows] -> [num_rows, H].
    Sums in float32 whatever the compute dtype, so bf16 models pool accurately.
    """
    sums = torch.zeros(num_rows, hidden.shape[1], dtype=torch.float32, device=hidden.device)
    sums.index_add_(0, seq_ids, hidden.float())
    return sums / lengths.clamp(min=1).to(torch.float32)[:, None]
