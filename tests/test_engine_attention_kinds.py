"""Attention kinds (bidirectional, causal, sliding window) in every packed layout.

The reference is written independently of attention.py: for each sequence
alone, explicit scores q k^T / sqrt(d), -inf where the kind forbids the pair,
softmax, times v, in float64.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from embedserve.engine.modules.attention import (
    ATTENTION_IMPLS,
    BIDIRECTIONAL,
    CAUSAL,
    AttentionKind,
    block_diagonal_from_seq_ids,
    padded_from_ids,
)
from embedserve.engine.modules.layout import build_layout

LENGTHS = [1, 5, 2, 17, 9, 1, 30]
KINDS = [BIDIRECTIONAL, CAUSAL, AttentionKind(window=3), AttentionKind(causal=True, window=3),
         AttentionKind(window=0), AttentionKind(causal=True, window=100)]


def reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, lengths: list[int],
              kind: AttentionKind) -> torch.Tensor:
    out, start = [], 0
    for n in lengths:
        qs, ks, vs = (t[start:start + n].double().transpose(0, 1) for t in (q, k, v))  # [h, n, d]
        scores = qs @ ks.transpose(1, 2) / math.sqrt(q.shape[-1])
        for i in range(n):
            for j in range(n):
                if (kind.causal and j > i) or (kind.window is not None and abs(i - j) > kind.window):
                    scores[:, i, j] = -math.inf
        out.append((scores.softmax(-1) @ vs).transpose(0, 1))
        start += n
    return torch.cat(out).float()


def qkv(seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(sum(LENGTHS), 4, 8, generator=g) for _ in range(3))   # type: ignore[return-value]


@pytest.mark.parametrize("impl", sorted(ATTENTION_IMPLS))
@pytest.mark.parametrize("kind", KINDS, ids=str)
def test_builder_kind_matches_reference(impl: str, kind: AttentionKind) -> None:
    q, k, v = qkv(0)
    layout = build_layout(np.cumsum([0] + LENGTHS).astype(np.int32))
    attend = ATTENTION_IMPLS[impl](layout, causal=kind.causal, window=kind.window)
    expected = reference(q, k, v, LENGTHS, kind)
    assert torch.allclose(attend(q, k, v), expected, atol=1e-5)


@pytest.mark.parametrize("impl", sorted(ATTENTION_IMPLS))
def test_a_layer_can_ask_for_another_kind_than_the_default(impl: str) -> None:
    """ModernBERT style: one closure per step, global and local layers both use it."""
    q, k, v = qkv(1)
    layout = build_layout(np.cumsum([0] + LENGTHS).astype(np.int32))
    attend = ATTENTION_IMPLS[impl](layout)
    local = AttentionKind(window=2)
    for _ in range(2):                                  # masks are cached per kind: ask twice
        assert torch.allclose(attend(q, k, v, kind=local), reference(q, k, v, LENGTHS, local), atol=1e-5)
        assert torch.allclose(attend(q, k, v), reference(q, k, v, LENGTHS, BIDIRECTIONAL), atol=1e-5)
    # the kinds really differ on this data, so the checks above can fail
    assert not torch.allclose(reference(q, k, v, LENGTHS, local), reference(q, k, v, LENGTHS, CAUSAL),
                              atol=1e-3)


@pytest.mark.parametrize("kind", [CAUSAL, AttentionKind(causal=True, window=4)], ids=str)
def test_static_layouts_keep_bucket_padding_out(kind: AttentionKind) -> None:
    """CUDA-graph bucket shape: padding tokens in a dump row and empty rows never leak in."""
    q, k, v = qkv(2)
    real = sum(LENGTHS)
    pad = 11
    q, k, v = (torch.cat([t, torch.randn(pad, 4, 8) * 50]) for t in (q, k, v))
    seq_ids = torch.tensor(np.repeat(np.arange(len(LENGTHS)), LENGTHS).tolist() + [8] * pad)
    offsets = torch.tensor(np.concatenate([np.arange(n) for n in LENGTHS]).tolist() + [0] * pad)
    lengths = torch.tensor(LENGTHS + [0, pad])                                     # row 7 empty, 8 = dump
    expected = reference(q[:real], k[:real], v[:real], LENGTHS, kind)
    for attend in (block_diagonal_from_seq_ids(seq_ids, kind.causal, kind.window),
                   padded_from_ids(seq_ids, offsets, lengths, max(LENGTHS), kind.causal, kind.window)):
        assert torch.allclose(attend(q, k, v)[:real], expected, atol=1e-5)


def test_negative_window_is_refused() -> None:
    with pytest.raises(ValueError, match="window"):
        AttentionKind(window=-1)
