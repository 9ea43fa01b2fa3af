"""Attention restricted to each sequence of a packed batch.

Owns the ways of keeping a token's attention inside its own sequence when all
sequences share one ``[T, heads, head_dim]`` tensor. Each builder takes the
batch layout once per step and returns an ``Attend`` closure the encoder calls
in every layer:

- ``per_sequence``: one SDPA call per sequence on a slice (no padding at all;
  B calls per layer).
- ``padded``: scatter into a padded ``[B, heads, L, hd]`` view, one SDPA with a
  key mask, gather back (padding in attention only, never in dense layers).
- ``block_diagonal``: one SDPA over all T tokens with a mask allowing only
  same-sequence pairs (static shapes: what CUDA graphs need). Its cost and
  memory grow with T squared (the math path materializes heads x T x T
  scores: 12 GB at T = 16k), so it suits small token counts only.

Which one the engine uses on CPU was chosen by measurement (BENCHMARKS.md,
engine section; ``bench/engine_bench.py --attention``).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

from embedserve.engine.modules.bert import Attend
from embedserve.engine.modules.layout import PackedLayout


def per_sequence(layout: PackedLayout) -> Attend:
    bounds = list(zip(layout.starts, layout.ends))

    def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        # q, k, v: [T, heads, hd]; each slice -> [1, heads, L, hd] for SDPA
        out = torch.empty_like(q)
        for start, end in bounds:
            qs, ks, vs = (t[start:end].transpose(0, 1).unsqueeze(0) for t in (q, k, v))
            out[start:end] = F.scaled_dot_product_attention(qs, ks, vs)[0].transpose(0, 1)
        return out

    return attend


def padded_from_ids(seq_ids: torch.Tensor, offsets: torch.Tensor, lengths: torch.Tensor,
                    longest: int) -> Attend:
    """Scatter tokens into rows of ``longest`` slots, one SDPA with a key mask, gather back.

    seq_ids, offsets: [T] (row and column of each token); lengths: [R]. Static
    shapes for fixed (T, R, longest), so CUDA graphs can capture it. Tokens of
    a CUDA-graph bucket's padding all land in the last (dump) row; rows without
    tokens are never gathered back.
    """
    rows = lengths.shape[0]
    slot = seq_ids * longest + offsets.clamp(max=longest - 1)                         # [T]
    key_mask = torch.arange(longest, device=lengths.device)[None, :] < lengths[:, None]  # [R, L]
    mask = key_mask[:, None, None, :]                                               # [R, 1, 1, L]

    def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        heads, hd = q.shape[1], q.shape[2]

        def to_padded(t: torch.Tensor) -> torch.Tensor:
            buffer = t.new_zeros(rows * longest, heads, hd)
            buffer[slot] = t
            return buffer.view(rows, longest, heads, hd).transpose(1, 2)            # [R, heads, L, hd]

        ctx = F.scaled_dot_product_attention(to_padded(q), to_padded(k), to_padded(v), attn_mask=mask)
        return ctx.transpose(1, 2).reshape(rows * longest, heads, hd)[slot]          # [T, heads, hd]

    return attend


def padded(layout: PackedLayout) -> Attend:
    return padded_from_ids(layout.seq_ids_tensor, layout.offsets_tensor, layout.lengths_tensor,
                           layout.max_length)


def block_diagonal_from_seq_ids(seq_ids: torch.Tensor) -> Attend:
    """One attention over all tokens; ``seq_ids [T]`` says which pairs may attend.

    Padding tokens (in a CUDA-graph bucket) carry their own id, so they attend
    only to each other and never leak into real sequences.
    """
    mask = (seq_ids[:, None] == seq_ids[None, :])[None]                              # [1, T, T]

    def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        ctx = F.scaled_dot_product_attention(q.transpose(0, 1), k.transpose(0, 1),
                                             v.transpose(0, 1), attn_mask=mask)       # [heads, T, hd]
        return ctx.transpose(0, 1)

    return attend


def block_diagonal(layout: PackedLayout) -> Attend:
    return block_diagonal_from_seq_ids(layout.seq_ids_tensor)


ATTENTION_IMPLS: dict[str, Callable[[PackedLayout], Attend]] = {
    "per_sequence": per_sequence,
    "padded": padded,
    "block_diagonal": block_diagonal,
}
