"""The ModernBERT encoder family on packed tokens (gte-modernbert, modernbert-embed).

One readable module, like bert.py: token embeddings with a norm, pre-norm
layers with rotary positions, GeGLU feed-forward and a final norm, on a flat
``[T, hidden]`` token matrix with no padding. Every few layers attend to the
whole sequence (global, RoPE base ``global_rope_theta``); the others only to a
band of ``local_attention // 2`` tokens either side (local, its own RoPE base).

Global layers use the ``Attend`` the caller passes (attention.py: per
sequence, padded or block-diagonal), exactly as the BERT path. Local layers
use ``local_attention`` below, built from the position ids alone, so the runners
and the CUDA-graph buckets need nothing new: on CPU in bf16 the native attention
kernel with the window as a bias by distance, where the sequences are short enough
for its dense scores to pay, else ``sliding_window_from_positions`` (banded SDPA).
Knows nothing about files, batching or devices.
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F
from torch import nn

from embedserve.engine.modules import bf16_attention
from embedserve.engine.modules.attention import BIDIRECTIONAL, AttentionKind
from embedserve.engine.modules.bert import Attend, activation, embedding_table
from embedserve.engine.modules.layout import bounds_from_offsets
from embedserve.model.modernbert_config import GLOBAL, LOCAL, ModernBertConfig

# Position id of the rows a banded block pads with: far from any real position,
# so a padded key never passes the same-sequence test of a real query.
_NO_POSITION = -(1 << 40)
# Local layers take the native kernel while the longest sequence is at most this many
# windows. The kernel scores every key of a sequence, the banded SDPA only the window's,
# but each of the kernel's scores is cheaper. Measured on base widths (6 layers, bf16,
# AMD EPYC Zen 5, 2 threads): a step with local layers on the kernel against banded took
# 0.89x at 8 x 512 tokens, 0.92x at 4 x 1024, 1.04x at 1 x 2048 and 1.32x at 1 x 4096
# (window 128).
NATIVE_WINDOWS = 8
# The bias outside the window: its exponential underflows to 0 (the kernel's exp takes
# no -inf), and a query's own key, inside, keeps the row's maximum finite.
_OUTSIDE_WINDOW = -1e30


def rope_tables(position_ids: torch.Tensor, theta: float, head_dim: int,
                dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin [T, head_dim] for rotating heads at ``position_ids [T]`` (as transformers)."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32,
                                             device=position_ids.device) / head_dim))
    freqs = position_ids.float()[:, None] * inv_freq[None, :]                     # [T, hd/2]
    angles = torch.cat((freqs, freqs), dim=-1)                                    # [T, hd]
    return angles.cos().to(dtype), angles.sin().to(dtype)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    # x: [T, heads, hd]; cos, sin: [T, hd]. Rotation in float32, as transformers does.
    half = x.shape[-1] // 2
    xf = x.float()
    rotated = torch.cat((-xf[..., half:], xf[..., :half]), dim=-1)
    return (xf * cos[:, None, :] + rotated * sin[:, None, :]).to(x.dtype)


def _pad_rows(t: torch.Tensor, before: int, after: int, value: float = 0.0) -> torch.Tensor:
    parts = [t.new_full((before, *t.shape[1:]), value), t, t.new_full((after, *t.shape[1:]), value)]
    return torch.cat(parts, dim=0)


def sliding_window_from_positions(position_ids: torch.Tensor, window: int) -> Attend:
    """Bidirectional attention over ``|i - j| <= window // 2`` inside each sequence.

    HF ModernBERT's rule (``sliding_window_bidirectional_overlay``). Sequences
    are contiguous and their positions restart at 0, so tokens ``i`` and ``j``
    are in the same sequence exactly when ``pos[j] - pos[i] == j - i`` (for
    different sequences the start offsets differ). A CUDA bucket's padding
    tokens all have position 0 and so see only themselves.

    Cost is banded, not quadratic: queries go in blocks of ``block`` tokens,
    each against its ``block + 2 * half`` neighbouring keys (one batched SDPA,
    static shapes for a fixed T).
    """
    half = window // 2
    tokens = position_ids.shape[0]
    # Blocks as wide as the window, or as the whole batch when that is smaller.
    block = max(16, min(2 * half, -(-tokens // 16) * 16))
    blocks = -(-tokens // block)
    tail = blocks * block - tokens
    span = block + 2 * half
    q_pos = _pad_rows(position_ids, 0, tail, _NO_POSITION).view(blocks, block)        # [nb, B]
    k_pos = _pad_rows(position_ids, half, tail + half, _NO_POSITION).unfold(0, span, block)  # [nb, S]
    rows = torch.arange(block, device=position_ids.device)
    cols = torch.arange(span, device=position_ids.device)
    distance = cols[None, :] - half - rows[:, None]                                  # [B, S]: j - i
    same_sequence = (k_pos[:, None, :] - q_pos[:, :, None]) == distance[None]
    mask = (same_sequence & (distance.abs() <= half)[None])[:, None]                 # [nb, 1, B, S]

    def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        heads, hd = q.shape[1], q.shape[2]
        qb = _pad_rows(q, 0, tail).view(blocks, block, heads, hd).transpose(1, 2)   # [nb, h, B, hd]
        kb, vb = (_pad_rows(t, half, tail + half).unfold(0, span, block).permute(0, 1, 3, 2)
                  for t in (k, v))                                                 # [nb, h, S, hd]
        ctx = F.scaled_dot_product_attention(qb, kb, vb, attn_mask=mask)            # [nb, h, B, hd]
        return ctx.transpose(1, 2).reshape(blocks * block, heads, hd)[:tokens]       # [T, h, hd]

    return attend  # type: ignore[return-value]  # an Attend


def local_attention(position_ids: torch.Tensor, window: int) -> Attend:
    """``sliding_window_from_positions``'s attention; on the native bf16 kernel (a bias of
    0 for ``|i - j| <= window // 2``, ``_OUTSIDE_WINDOW`` beyond) for the calls it covers,
    where ``position_ids`` are on the CPU and no sequence is over NATIVE_WINDOWS windows."""
    if position_ids.device.type != "cpu" or not bf16_attention.kernel_available():
        return sliding_window_from_positions(position_ids, window)   # CUDA: no host sync here
    starts, lengths = bounds_from_offsets(position_ids)   # positions restart at 0: they are the offsets
    longest = int(lengths.max())
    if longest > NATIVE_WINDOWS * window:
        return sliding_window_from_positions(position_ids, window)
    distance = torch.arange(1 - longest, longest)
    row = torch.where(distance.abs() <= window // 2, 0.0, _OUTSIDE_WINDOW).float()
    by_heads: dict[int, torch.Tensor] = {}
    banded: list[Attend] = []   # for calls the kernel does not cover (float32), built on the first

    def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        if not bf16_attention.covers(q, k, v):
            if not banded:
                banded.append(sliding_window_from_positions(position_ids, window))
            return banded[0](q, k, v)
        heads = q.shape[1]
        if heads not in by_heads:
            by_heads[heads] = row.expand(heads, -1).contiguous()
        return bf16_attention.attend_sequences(q, k, v, starts, lengths, bias=by_heads[heads])

    return attend  # type: ignore[return-value]  # an Attend


class Embeddings(nn.Module):
    def __init__(self, config: ModernBertConfig) -> None:
        super().__init__()
        self.word = embedding_table(config.vocab_size, config.hidden_size)
        self.norm = nn.LayerNorm(config.hidden_size, eps=config.norm_eps, bias=config.norm_bias)

    def forward(self, token_ids: torch.Tensor) -> torch.Tensor:
        # token_ids: [T] -> [T, hidden]; no position table (RoPE) and no segments
        return self.norm(self.word(token_ids))


class Layer(nn.Module):
    """Pre-norm layer: x += attn(LN(x)); x += GeGLU(LN(x)). Layer 0 has no attention norm
    (the embeddings' norm precedes it)."""

    def __init__(self, config: ModernBertConfig, index: int) -> None:
        super().__init__()
        hidden = config.hidden_size
        self.num_heads = config.num_heads
        self.head_dim = config.head_dim
        self.attn_norm: nn.Module = (nn.Identity() if index == 0 else
                                     nn.LayerNorm(hidden, eps=config.norm_eps, bias=config.norm_bias))
        self.qkv = nn.Linear(hidden, 3 * hidden, bias=config.attention_bias)
        self.attn_out = nn.Linear(hidden, hidden, bias=config.attention_bias)
        self.mlp_norm = nn.LayerNorm(hidden, eps=config.norm_eps, bias=config.norm_bias)
        # Wi: the GeGLU's input and gate halves in one matmul.
        self.mlp_in = nn.Linear(hidden, 2 * config.intermediate_size, bias=config.mlp_bias)
        self.mlp_out = nn.Linear(config.intermediate_size, hidden, bias=config.mlp_bias)
        self.act = activation(config.hidden_act)

    def forward(self, x: torch.Tensor, attend: Attend, cos: torch.Tensor,
                sin: torch.Tensor) -> torch.Tensor:
        # x: [T, hidden]; cos, sin: [T, hd]
        tokens = x.shape[0]
        qkv = self.qkv(self.attn_norm(x)).view(tokens, 3, self.num_heads, self.head_dim)
        q, k = apply_rope(qkv[:, 0], cos, sin), apply_rope(qkv[:, 1], cos, sin)
        context = attend(q, k, qkv[:, 2])                                          # [T, heads, hd]
        x = x + self.attn_out(context.reshape(tokens, -1))
        value, gate = self.mlp_in(self.mlp_norm(x)).chunk(2, dim=-1)               # [T, inter] each
        return x + self.mlp_out(self.act(value) * gate)


class ModernBertModel(nn.Module):
    """Token ids in, final (normed) hidden states out: [T] -> [T, hidden].

    The same call signature as bert.EncoderModel, so forward.py, the CPU runner
    and the CUDA-graph buckets run it unchanged; ``token_type_ids`` are ignored
    (ModernBERT has no segment embeddings).
    """

    head: nn.Module | None = None          # an embedder: no classification head

    # Global layers use the layout the runner builds; local layers band their own window.
    attention_kind: AttentionKind = BIDIRECTIONAL

    def __init__(self, config: ModernBertConfig) -> None:
        super().__init__()
        self.config = config
        self.embeddings = Embeddings(config)
        self.layers = nn.ModuleList(Layer(config, i) for i in range(config.num_layers))
        self.final_norm = nn.LayerNorm(config.hidden_size, eps=config.norm_eps, bias=config.norm_bias)
        # False: CPU local layers stay on the banded SDPA (bench modernbert --local-ab)
        self.native_local = True

    def forward(self, token_ids: torch.Tensor, position_ids: torch.Tensor,
                token_type_ids: torch.Tensor, attend: Attend) -> torch.Tensor:
        config = self.config
        x = self.embeddings(token_ids)                                            # [T, hidden]
        thetas = {GLOBAL: config.global_rope_theta, LOCAL: config.local_rope_theta}
        # RoPE tables are computed here, not kept as buffers: nothing to re-create
        # after the meta-device build, and they cost O(T x head_dim) per step.
        rope = {kind: rope_tables(position_ids, thetas[kind], config.head_dim, x.dtype)
                for kind in set(config.layer_types)}
        attends = {GLOBAL: attend}
        if LOCAL in rope and getattr(attend, "windowed", False):
            # The layout runs windows itself (the CUDA varlen kernel): no banded mask.
            attends[LOCAL] = functools.partial(attend, kind=AttentionKind(window=config.local_window // 2))
        elif LOCAL in rope and self.native_local:
            attends[LOCAL] = local_attention(position_ids, config.local_window)
        elif LOCAL in rope:
            attends[LOCAL] = sliding_window_from_positions(position_ids, config.local_window)
        for layer, kind in zip(self.layers, config.layer_types):
            x = layer(x, attends[kind], *rope[kind])
        return self.final_norm(x)

    def score(self, cls_states: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError("ModernBERT is served as an embedder only")
