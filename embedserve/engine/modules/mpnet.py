"""The MPNet encoder family on packed tokens (all-mpnet-base-v2, multi-qa-mpnet).

MPNet's layers are BERT's post-norm layers (bert.py), so the model *is* an
``EncoderModel`` and the CPU speed-ups (onednn.py's fused layers, native
linears) apply unchanged. What differs: no segment embeddings (weights.py
gives it a one-row zero table), positions counted from 2, and a relative
position bias, one ``[heads]`` vector per distance bucket, added to every
layer's attention scores (computed once per step, shared by all layers, as
transformers does).

The bias is added by the ``Attend`` this module builds from the position ids
alone (sequences restart at position 0), so runners and CUDA-graph buckets
need nothing new:

- ``per_sequence_native``: on CPU, the native bf16 attention kernel
  (bf16_attention.py) with the bias as one float32 row per head by distance
  (``relative_bias_rows``), where the kernel covers the call (bf16, head size 32
  or 64, AVX512-BF16); else
- ``per_sequence_biased``: one SDPA per sequence with its ``[heads, L, L]``
  slice of one bias table (CPU: no padding at all);
- ``block_diagonal_biased``: one SDPA over all T tokens, the bias where two
  tokens share a sequence and -inf elsewhere (static shapes: CUDA graphs;
  memory grows with heads x T^2, so it suits the bucket sizes graphs use).

Knows nothing about files, batching or devices beyond choosing between these two.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from embedserve.engine.modules import bf16_attention
from embedserve.engine.modules.attention import Attend, AttentionKind
from embedserve.engine.modules.bert import EncoderModel, embedding_table
from embedserve.engine.modules.layout import bounds_from_offsets
from embedserve.model.bert_variants_config import (
    MPNET_BUCKETS,
    MPNET_MAX_DISTANCE,
    MPNetConfig,
)


def relative_buckets(relative_position: torch.Tensor, num_buckets: int = MPNET_BUCKETS,
                     max_distance: int = MPNET_MAX_DISTANCE) -> torch.Tensor:
    """T5-style bucket of ``key_pos - query_pos`` (transformers' MPNet formula, int64)."""
    n = -relative_position
    half = num_buckets // 2
    bucket = (n < 0).to(torch.long) * half
    n = n.abs()
    max_exact = half // 2
    # log of 0 for the small distances is discarded by the where below
    large = max_exact + (torch.log(n.float() / max_exact) / math.log(max_distance / max_exact)
                         * (half - max_exact)).to(torch.long)
    large = torch.clamp(large, max=half - 1)
    return bucket + torch.where(n < max_exact, n, large)


def _bias(distance: torch.Tensor, table: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    # distance: [Q, K] key - query; table: [buckets, heads] -> [heads, Q, K]
    return table[relative_buckets(distance)].permute(2, 0, 1).to(dtype)


def relative_bias_rows(table: torch.Tensor, reach: int) -> torch.Tensor:
    """The bias by distance as the native kernel reads it: float32 [heads, 2 * reach + 1],
    column d + reach holding the bias of key - query = d (the table's values, as
    ``_bias`` gives them)."""
    distance = torch.arange(-reach, reach + 1, device=table.device)
    return table[relative_buckets(distance)].t().float().contiguous()


def per_sequence_native(offsets: torch.Tensor, table: torch.Tensor) -> Attend:
    """Attention inside each sequence plus MPNet's bias on the native kernel, for the
    calls it covers; the others go to ``per_sequence_biased`` (built on first use)."""
    starts, lengths = bounds_from_offsets(offsets)
    rows = relative_bias_rows(table, int(lengths.max()) - 1)
    fallback: list[Attend] = []

    def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
               kind: AttentionKind | None = None, quantized: bool = False) -> torch.Tensor:
        if bf16_attention.covers(q, k, v):
            return bf16_attention.attend_sequences(q, k, v, starts, lengths, bias=rows)
        if not fallback:
            fallback.append(per_sequence_biased(offsets, table))
        return fallback[0](q, k, v, kind)

    return attend


def per_sequence_biased(offsets: torch.Tensor, table: torch.Tensor) -> Attend:
    """Attention inside each sequence plus MPNet's bias; ``offsets [T]`` restart at 0 per sequence."""
    starts, lengths = bounds_from_offsets(offsets)
    bounds = list(zip(starts.tolist(), (starts + lengths).tolist()))
    index = torch.arange(int(lengths.max()), device=offsets.device)
    bias = _bias(index[None, :] - index[:, None], table, table.dtype)           # [heads, L, L]
    by_length: dict[int, torch.Tensor] = {}

    def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
               kind: AttentionKind | None = None, quantized: bool = False) -> torch.Tensor:
        # q, k, v: [T, heads, hd]; each sequence -> [1, heads, L, hd]
        out = torch.empty_like(q)
        for start, end in bounds:
            n = end - start
            if n not in by_length:
                by_length[n] = bias[:, :n, :n].to(q.dtype).contiguous()[None]
            qs, ks, vs = (t[start:end].transpose(0, 1).unsqueeze(0) for t in (q, k, v))
            out[start:end] = F.scaled_dot_product_attention(
                qs, ks, vs, attn_mask=by_length[n])[0].transpose(0, 1)
        return out

    return attend


def block_diagonal_biased(offsets: torch.Tensor, table: torch.Tensor) -> Attend:
    """One attention over all tokens; pairs in different sequences masked out.

    Tokens i and j share a sequence exactly when ``offsets[j] - offsets[i] == j - i``
    (sequences are contiguous and restart at 0); a CUDA bucket's padding tokens all
    have offset 0 and so see only themselves.
    """
    index = torch.arange(offsets.shape[0], device=offsets.device)
    distance = offsets[None, :] - offsets[:, None]                              # [T, T]
    same_sequence = distance == index[None, :] - index[:, None]
    masks: dict[torch.dtype, torch.Tensor] = {}

    def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
               kind: AttentionKind | None = None, quantized: bool = False) -> torch.Tensor:
        if q.dtype not in masks:
            bias = _bias(distance, table, q.dtype)                              # [heads, T, T]
            masks[q.dtype] = bias.masked_fill(~same_sequence[None], float("-inf"))
        ctx = F.scaled_dot_product_attention(q.transpose(0, 1), k.transpose(0, 1),
                                             v.transpose(0, 1), attn_mask=masks[q.dtype])
        return ctx.transpose(0, 1)                                              # [T, heads, hd]

    return attend


class MPNetModel(EncoderModel):
    """EncoderModel with MPNet's relative-position bias; ``attend`` from the runner is
    replaced by a biased one built from the position ids."""

    def __init__(self, config: MPNetConfig) -> None:
        super().__init__(config)
        self.relative_bias = embedding_table(config.relative_attention_num_buckets, config.num_heads)
        # False: CPU steps add the bias as SDPA's mask even where the kernel runs (bench mpnet --bias-ab)
        self.native_attention = True

    def forward(self, token_ids: torch.Tensor, position_ids: torch.Tensor,
                token_type_ids: torch.Tensor, attend: Attend) -> torch.Tensor:
        offsets = position_ids - self.config.position_offset                    # [T], 0 at each start
        table = self.relative_bias.weight                                       # [buckets, heads]
        if offsets.device.type != "cpu":
            biased = block_diagonal_biased(offsets, table)   # static shapes for CUDA graphs
        elif self.native_attention and table.dtype == torch.bfloat16 and bf16_attention.kernel_available():
            biased = per_sequence_native(offsets, table)
        else:
            biased = per_sequence_biased(offsets, table)
        return self.encoder(token_ids, position_ids, torch.zeros_like(token_type_ids), biased)
