"""The DeBERTa-v2 / v3 encoder family on packed tokens, with its reranker head.

DeBERTa's layers are BERT's post-norm layers (bert.py's ``Layer``, so the CPU
speed-ups of onednn.py apply unchanged); what differs is the attention score.
Besides content-to-content (q . k), "disentangled" attention adds
content-to-position (q_i . Kr[d(i, j)]) and position-to-content
(k_j . Qr[d(j, i)]) terms, where Kr, Qr are each layer's own key / query
projections of a shared table of relative-position embeddings and d the
(log-bucketed) distance; everything is divided by sqrt(head_dim x (1 + terms)).
The extra terms enter SDPA as an additive float mask, built per sequence
(``per_sequence_disentangled``, CPU) or for the whole packed batch with
cross-sequence pairs at -inf (``block_diagonal_disentangled``: static shapes,
CUDA graphs). Sequences are found from the position ids alone (they restart at
0), as modules/mpnet.py does.

Knows nothing about files, batching or devices beyond choosing between these two.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from functools import partial

import torch
import torch.nn.functional as F
from torch import nn

from embedserve.engine.modules.attention import Attend, AttentionKind
from embedserve.engine.modules.bert import (
    EncoderModel,
    Layer,
    activation,
    embedding_table,
)
from embedserve.engine.modules.layout import bounds_from_offsets
from embedserve.model.deberta_v2_config import DebertaV2Config

# A step's sequences, once: (a layer's Qr, Kr [2 span, heads, hd]) -> that layer's Attend
LayerAttention = Callable[[torch.Tensor, torch.Tensor], Attend]


def log_buckets(relative: torch.Tensor, bucket_size: int, max_position: int) -> torch.Tensor:
    """transformers' ``make_log_bucket_position``: exact below bucket_size // 2, log above."""
    sign = torch.sign(relative)
    mid = bucket_size // 2
    small = (relative < mid) & (relative > -mid)
    abs_pos = torch.where(small, torch.full_like(relative, mid - 1), relative.abs()).float()
    log_pos = torch.ceil(torch.log(abs_pos / mid) / math.log((max_position - 1) / mid) * (mid - 1)) + mid
    return torch.where(abs_pos <= mid, relative.float(), log_pos * sign).long()


def relative_positions(query_pos: torch.Tensor, key_pos: torch.Tensor, config: DebertaV2Config) -> torch.Tensor:
    """int64 [Q, K]: the (bucketed) distance query - key."""
    relative = query_pos[:, None] - key_pos[None, :]
    if config.position_buckets > 0 and config.max_relative_positions > 0:
        relative = log_buckets(relative, config.position_buckets, config.max_relative_positions)
    return relative


def disentangled_bias(q: torch.Tensor, k: torch.Tensor, relative: torch.Tensor, pos_q: torch.Tensor,
                      pos_k: torch.Tensor, config: DebertaV2Config) -> torch.Tensor:
    """The c2p + p2c terms, already divided by the scale: [heads, Q, K].

    q, k: [L, heads, hd]; relative: [L, L]; pos_q, pos_k: [2 span, heads, hd].
    Only the rows of the position tables the distances reach are multiplied.
    """
    span = config.attention_span
    c2p_index = torch.clamp(relative + span, 0, 2 * span - 1)                     # [L, L]
    p2c_index = torch.clamp(-relative + span, 0, 2 * span - 1)
    low = int(torch.minimum(c2p_index.min(), p2c_index.min()))
    high = int(torch.maximum(c2p_index.max(), p2c_index.max())) + 1
    heads = q.shape[1]
    scale = math.sqrt(q.shape[-1] * (1 + len(config.pos_att_type)))
    bias = q.new_zeros(heads, q.shape[0], k.shape[0])
    if "c2p" in config.pos_att_type:
        c2p = torch.einsum("qhd,phd->hqp", q, pos_k[low:high])                  # [heads, L, P]
        bias += torch.gather(c2p, -1, (c2p_index - low)[None].expand(heads, -1, -1))
    if "p2c" in config.pos_att_type:
        p2c = torch.einsum("khd,phd->hkp", k, pos_q[low:high])                  # [heads, L, P]
        bias += torch.gather(p2c, -1, (p2c_index - low)[None].expand(heads, -1, -1)).transpose(-1, -2)
    return bias / scale


def _scale(head_dim: int, config: DebertaV2Config) -> float:
    return 1.0 / math.sqrt(head_dim * (1 + len(config.pos_att_type)))


def per_sequence_disentangled(offsets: torch.Tensor, config: DebertaV2Config) -> LayerAttention:
    """One SDPA per sequence with its disentangled bias; ``offsets [T]`` restart at 0."""
    starts, lengths = bounds_from_offsets(offsets)
    bounds = list(zip(starts.tolist(), (starts + lengths).tolist()))
    index = torch.arange(int(lengths.max()), device=offsets.device)
    relative = relative_positions(index, index, config)                         # [L, L]

    def for_layer(pos_q: torch.Tensor, pos_k: torch.Tensor) -> Attend:
        return partial(attend, pos_q=pos_q, pos_k=pos_k)

    def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kind: AttentionKind | None = None, *,
               pos_q: torch.Tensor, pos_k: torch.Tensor) -> torch.Tensor:
        out = torch.empty_like(q)
        scale = _scale(q.shape[-1], config)
        for start, end in bounds:
            n = end - start
            qs, ks, vs = q[start:end], k[start:end], v[start:end]
            bias = disentangled_bias(qs, ks, relative[:n, :n], pos_q, pos_k, config)
            out[start:end] = F.scaled_dot_product_attention(
                qs.transpose(0, 1)[None], ks.transpose(0, 1)[None], vs.transpose(0, 1)[None],
                attn_mask=bias[None], scale=scale)[0].transpose(0, 1)
        return out

    return for_layer


def block_diagonal_disentangled(offsets: torch.Tensor, config: DebertaV2Config) -> LayerAttention:
    """One SDPA over all tokens; pairs of different sequences (``offsets[j] - offsets[i]
    != j - i``) at -inf. Static shapes for a fixed T (CUDA graphs)."""
    index = torch.arange(offsets.shape[0], device=offsets.device)
    same_sequence = (offsets[None, :] - offsets[:, None]) == (index[None, :] - index[:, None])
    relative = relative_positions(offsets, offsets, config)

    def for_layer(pos_q: torch.Tensor, pos_k: torch.Tensor) -> Attend:
        return partial(attend, pos_q=pos_q, pos_k=pos_k)

    def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kind: AttentionKind | None = None, *,
               pos_q: torch.Tensor, pos_k: torch.Tensor) -> torch.Tensor:
        span = config.attention_span
        bias = _full_table_bias(q, k, relative, pos_q, pos_k, config, span)
        bias = bias.masked_fill(~same_sequence[None], float("-inf"))
        ctx = F.scaled_dot_product_attention(q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1),
                                             attn_mask=bias, scale=_scale(q.shape[-1], config))
        return ctx.transpose(0, 1)

    return for_layer


def _full_table_bias(q: torch.Tensor, k: torch.Tensor, relative: torch.Tensor, pos_q: torch.Tensor,
                     pos_k: torch.Tensor, config: DebertaV2Config, span: int) -> torch.Tensor:
    """disentangled_bias without the data-dependent slice of the tables (no host sync)."""
    heads = q.shape[1]
    scale = math.sqrt(q.shape[-1] * (1 + len(config.pos_att_type)))
    bias = q.new_zeros(heads, q.shape[0], k.shape[0])
    if "c2p" in config.pos_att_type:
        index = torch.clamp(relative + span, 0, 2 * span - 1)[None].expand(heads, -1, -1)
        bias += torch.gather(torch.einsum("qhd,phd->hqp", q, pos_k), -1, index)
    if "p2c" in config.pos_att_type:
        index = torch.clamp(-relative + span, 0, 2 * span - 1)[None].expand(heads, -1, -1)
        bias += torch.gather(torch.einsum("khd,phd->hkp", k, pos_q), -1, index).transpose(-1, -2)
    return bias / scale


class Embeddings(nn.Module):
    def __init__(self, config: DebertaV2Config) -> None:
        super().__init__()
        width = config.embedding_size
        self.word = embedding_table(config.vocab_size, width)
        self.position = (embedding_table(config.max_position_embeddings, width)
                         if config.position_biased_input else None)
        self.token_type = (embedding_table(config.segment_vocab_size, width)
                           if config.segment_vocab_size > 0 else None)
        self.embed_proj = (nn.Linear(width, config.hidden_size, bias=False)
                           if width != config.hidden_size else None)
        self.norm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)

    def forward(self, token_ids: torch.Tensor, offsets: torch.Tensor,
                token_type_ids: torch.Tensor) -> torch.Tensor:
        # [T] each -> [T, hidden]
        x = self.word(token_ids)
        if self.position is not None:
            x = x + self.position(offsets)
        if self.token_type is not None:
            x = x + self.token_type(token_type_ids)
        if self.embed_proj is not None:
            x = self.embed_proj(x)
        return self.norm(x)


class Encoder(nn.Module):
    def __init__(self, config: DebertaV2Config) -> None:
        super().__init__()
        self.embeddings = Embeddings(config)
        self.layers = nn.ModuleList(Layer(config) for _ in range(config.num_layers))  # type: ignore[arg-type]
        self.rel_embeddings = (embedding_table(2 * config.attention_span, config.hidden_size)
                               if config.relative_attention else None)
        self.rel_norm = (nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
                         if config.relative_attention and config.norm_rel_ebd else None)


class ContextPoolerHead(nn.Module):
    """DeBERTa's reranker head: classifier(act(dense(first token)))."""

    def __init__(self, config: DebertaV2Config) -> None:
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)
        self.out_proj = nn.Linear(config.hidden_size, config.num_labels)
        self.act = activation(config.pooler_hidden_act)

    def forward(self, cls_states: torch.Tensor) -> torch.Tensor:
        return self.out_proj(self.act(self.dense(cls_states)))


class DebertaV2Model(EncoderModel):
    """DeBERTa-v2 encoder (and reranker head); an EncoderModel so its layers can be fused."""

    config: DebertaV2Config       # type: ignore[assignment]
    encoder: Encoder              # type: ignore[assignment]

    def __init__(self, config: DebertaV2Config) -> None:
        nn.Module.__init__(self)
        self.config = config
        self.encoder = Encoder(config)
        self.head = ContextPoolerHead(config) if config.task == "score" else None
        # Each layer's query / key projections of the relative embeddings depend on the
        # weights only: computed on first use per dtype and device, not every step.
        self._positions: dict[tuple[torch.dtype, torch.device], list[tuple[torch.Tensor, torch.Tensor]]] = {}

    def _position_tables(self, dtype: torch.dtype, device: torch.device) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Per layer (Qr, Kr), each [2 span, heads, hd]."""
        key = (dtype, device)
        if key not in self._positions:
            encoder, config = self.encoder, self.config
            assert encoder.rel_embeddings is not None, "relative attention needs its table"
            rel = encoder.rel_embeddings.weight
            if encoder.rel_norm is not None:
                rel = encoder.rel_norm(rel)
            hidden, heads = config.hidden_size, config.num_heads
            tables = []
            for layer in encoder.layers:
                qk = layer.qkv(rel.contiguous())  # type: ignore[operator]
                qk = qk[:, :2 * hidden].reshape(rel.shape[0], 2, heads, -1)
                tables.append((qk[:, 0].contiguous(), qk[:, 1].contiguous()))
            self._positions[key] = tables
        return self._positions[key]

    def forward(self, token_ids: torch.Tensor, position_ids: torch.Tensor,
                token_type_ids: torch.Tensor, attend: Attend) -> torch.Tensor:
        config = self.config
        offsets = position_ids - config.position_offset                         # [T], 0 at each start
        x = self.encoder.embeddings(token_ids, offsets, token_type_ids)          # [T, hidden]
        if not config.relative_attention:
            for layer in self.encoder.layers:
                x = layer(x, attend)
            return x
        if offsets.device.type == "cpu":
            for_layer = per_sequence_disentangled(offsets, config)
        else:
            for_layer = block_diagonal_disentangled(offsets, config)   # static shapes for CUDA graphs
        for layer, (pos_q, pos_k) in zip(self.encoder.layers, self._position_tables(x.dtype, x.device)):
            x = layer(x, for_layer(pos_q, pos_k))
        return x

    def _apply(self, fn, *args, **kwargs):
        # .to(dtype / device) makes the cached position tables stale.
        self._positions.clear()
        return super()._apply(fn, *args, **kwargs)
