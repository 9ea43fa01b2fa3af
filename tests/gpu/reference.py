"""A float64 reference of the varlen kernel's contract, one sequence at a time.

FlashAttention's varlen interface: sequences back to back at ``cu_seqlens``; key j is
visible to query i iff i - left <= j <= i + right (-1: unlimited); with fewer k/v
heads than q heads, query head h reads kv head h // (q_heads / kv_heads).
"""

from __future__ import annotations

import torch


def varlen_reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens: torch.Tensor,
                     window_size: tuple[int, int] = (-1, -1)) -> torch.Tensor:
    """q [T, Hq, D], k/v [T, Hkv, D] -> float64 [T, Hq, D] on the CPU."""
    left, right = window_size
    q, k, v = (t.detach().double().cpu() for t in (q, k, v))
    if k.shape[1] != q.shape[1]:
        groups = q.shape[1] // k.shape[1]
        k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
    out = torch.zeros_like(q)
    bounds = cu_seqlens.tolist()
    for start, end in zip(bounds[:-1], bounds[1:]):
        n = end - start
        if n == 0:
            continue
        i, j = torch.arange(n)[:, None], torch.arange(n)[None, :]
        visible = torch.ones(n, n, dtype=torch.bool)
        if left >= 0:
            visible &= j >= i - left
        if right >= 0:
            visible &= j <= i + right
        qs, ks, vs = (t[start:end].transpose(0, 1) for t in (q, k, v))
        scores = (qs @ ks.transpose(1, 2)) / q.shape[-1] ** 0.5
        out[start:end] = (scores.masked_fill(~visible, float("-inf")).softmax(-1) @ vs).transpose(0, 1)
    return out
