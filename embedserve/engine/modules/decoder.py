"""The decoder (LLM-derived) embedder family on packed tokens: Qwen3, Qwen2, Llama, Mistral.

One readable module: token embeddings, pre-norm RMSNorm layers with rotary
positions, grouped-query attention and a SwiGLU feed-forward, and the final
norm, all on a flat ``[T, hidden]`` token matrix with no padding. Rotary
angles come from each token's position inside its own sequence, so packing
changes nothing. Whether attention is causal (the default) or bidirectional
(``"is_causal": false``) is the config's (model/decoder_config.py); how it is
kept inside each sequence is the ``Attend`` function's (attention.py).
Knows nothing about files, batching or devices.

The family's variants are flags: Qwen3 normalizes each head of q and k before
the rotation, Qwen2 has q/k/v biases, Llama optional attention / MLP biases.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from embedserve.engine.modules.attention import Attend, AttentionKind
from embedserve.engine.modules.bert import embedding_table
from embedserve.model.decoder_config import DecoderConfig


class RMSNorm(nn.Module):
    """x / rms(x) * weight, computed in float32 as transformers does, then cast back."""

    def __init__(self, width: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(width))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # x: [..., width]
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x32.to(x.dtype)


def rotary_tables(position_ids: torch.Tensor, head_dim: int, theta: float,
                  dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin [T, 1, head_dim] for each token's position (the "default" rope type).

    Computed per step from positions (no table sized by max_positions) in
    float32, as transformers does, then cast to the compute dtype.
    """
    exponents = torch.arange(0, head_dim, 2, dtype=torch.int64, device=position_ids.device).float() / head_dim
    inv_freq = 1.0 / (theta ** exponents)                                          # [hd/2]
    angles = position_ids.float()[:, None] * inv_freq[None, :]                      # [T, hd/2]
    angles = torch.cat((angles, angles), dim=-1)[:, None, :]                        # [T, 1, hd]
    return angles.cos().to(dtype), angles.sin().to(dtype)


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    # x: [T, heads, hd]; rotate_half pairs dimension i with i + hd/2
    first, second = x.chunk(2, dim=-1)
    return x * cos + torch.cat((-second, first), dim=-1) * sin


class Layer(nn.Module):
    """Pre-norm decoder layer: x += attn(norm(x)); x += mlp(norm(x))."""

    def __init__(self, config: DecoderConfig) -> None:
        super().__init__()
        hidden, hd = config.hidden_size, config.head_dim
        self.num_heads, self.num_kv_heads, self.head_dim = config.num_heads, config.num_kv_heads, hd
        self.attn_norm = RMSNorm(hidden, config.rms_norm_eps)
        # Q, K and V fused into one matmul: [heads | kv_heads | kv_heads] x hd outputs.
        self.qkv = nn.Linear(hidden, (config.num_heads + 2 * config.num_kv_heads) * hd,
                             bias=config.qkv_bias)
        self.q_norm = RMSNorm(hd, config.rms_norm_eps) if config.qk_norm else None
        self.k_norm = RMSNorm(hd, config.rms_norm_eps) if config.qk_norm else None
        self.attn_out = nn.Linear(config.num_heads * hd, hidden, bias=config.out_bias)
        self.mlp_norm = RMSNorm(hidden, config.rms_norm_eps)
        # gate and up projections fused: one matmul, then split.
        self.gate_up = nn.Linear(hidden, 2 * config.intermediate_size, bias=config.mlp_bias)
        self.down = nn.Linear(config.intermediate_size, hidden, bias=config.mlp_bias)

    def attention(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                  attend: Attend) -> torch.Tensor:
        # x: [T, hidden] (normed) -> [T, hidden]
        tokens = x.shape[0]
        qkv = self.qkv(x).view(tokens, -1, self.head_dim)                         # [T, h + 2kv, hd]
        q, k, v = qkv.split([self.num_heads, self.num_kv_heads, self.num_kv_heads], dim=1)
        if self.q_norm is not None and self.k_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = rotate(q, cos, sin), rotate(k, cos, sin)
        groups = self.num_heads // self.num_kv_heads
        if groups > 1 and not getattr(attend, "grouped_heads", False):
            # Grouped-query attention: query head h reads kv head h // groups (a layout
            # that takes grouped heads, the CUDA varlen kernel, does this itself).
            k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
        context = attend(q, k, v.contiguous())                                     # [T, heads, hd]
        return self.attn_out(context.reshape(tokens, -1))

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                attend: Attend) -> torch.Tensor:
        x = x + self.attention(self.attn_norm(x), cos, sin, attend)
        gate, up = self.gate_up(self.mlp_norm(x)).chunk(2, dim=-1)
        return x + self.down(F.silu(gate) * up)


class DecoderModel(nn.Module):
    """Token ids in, final (normed) hidden states out: [T] -> [T, hidden].

    The same call signature as EncoderModel, so runners and graphs treat both
    alike; ``token_type_ids`` are accepted and ignored (decoders have no
    segment embeddings).
    """

    def __init__(self, config: DecoderConfig) -> None:
        super().__init__()
        self.config = config
        # Embedders: none; LLM rerankers: a score row. (An instance attribute: a class-level
        # default would shadow the registered submodule.)
        self.head: nn.Module | None = None
        if config.task == "score":
            # One logit from the last token: a converted reranker's ``score`` row, or a
            # Qwen3-Reranker's LM-head rows of "yes" minus "no" (engine/llm_head.py): the
            # vocabulary-wide projection is never computed.
            self.head = nn.Linear(config.hidden_size, 1, bias=False)
        self.attention_kind = AttentionKind(config.causal, config.attention_window)
        self.embed = embedding_table(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(Layer(config) for _ in range(config.num_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)

    def forward(self, token_ids: torch.Tensor, position_ids: torch.Tensor,
                token_type_ids: torch.Tensor, attend: Attend) -> torch.Tensor:
        x = self.embed(token_ids)                                                  # [T, hidden]
        cos, sin = rotary_tables(position_ids, self.config.head_dim, self.config.rope_theta, x.dtype)
        for layer in self.layers:
            x = layer(x, cos, sin, attend)
        return self.norm(x)

    def score(self, last_states: torch.Tensor) -> torch.Tensor:
        # last_states: [B, hidden] (each sequence's last token) -> logits [B]
        assert self.head is not None, "score() needs a reranker's head"
        return self.head(last_states)[:, 0]
