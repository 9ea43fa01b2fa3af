"""Pooling token states into one vector per sequence of a packed batch.

The model's pooling (model/config.py, from ``1_Pooling/config.json``): "cls"
(first token), "mean", or "lasttoken". Works on a packed ``[T, H]`` matrix.
"""

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


def last_token_pool(hidden: torch.Tensor, starts: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """Each sequence's last token state (decoder embedders: the EOS token sees all).

    hidden: [T, H]; starts, lengths: [R] -> float32 [R, H]. Rows of length 0
    (a CUDA-graph bucket's padding rows) pool to zeros, like mean pooling's.
    """
    last = (starts + lengths - 1).clamp(min=0)                                     # [R]
    present = (lengths > 0).to(torch.float32)[:, None]
    return hidden[last].float() * present
