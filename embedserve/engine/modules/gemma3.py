"""The Gemma3 text family on packed tokens, as EmbeddingGemma runs it (bidirectional).

One readable module, like decoder.py: scaled token embeddings, pre- and
post-norm layers (RMSNorm with a ``1 + weight`` scale, around both attention
and feed-forward), q / k RMSNorm per head, rotary positions with one base for
full layers and another for sliding ones, grouped-query attention scaled by
``query_pre_attn_scalar``, a GeGLU (tanh GELU) feed-forward and a final norm.

Full layers use the runner's ``Attend`` with the model's own kind
(bidirectional for EmbeddingGemma, causal otherwise); sliding layers the same
closure with ``kind=`` a window (attention.py builds one mask per kind per
step; the CUDA varlen kernel takes the window directly).
Knows nothing about files, batching or devices.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from embedserve.engine.modules.attention import Attend, AttentionKind
from embedserve.engine.modules.bert import embedding_table
from embedserve.engine.modules.decoder import rotary_tables, rotate
from embedserve.model.gemma3_config import FULL, SLIDING, Gemma3Config


class GemmaRMSNorm(nn.Module):
    """x / rms(x) * (1 + weight), in float32 as transformers does, then cast back."""

    def __init__(self, width: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(width))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return (x32 * (1.0 + self.weight.float())).to(x.dtype)


class Layer(nn.Module):
    def __init__(self, config: Gemma3Config) -> None:
        super().__init__()
        hidden, hd = config.hidden_size, config.head_dim
        self.num_heads, self.num_kv_heads, self.head_dim = config.num_heads, config.num_kv_heads, hd
        eps = config.rms_norm_eps
        self.attn_norm = GemmaRMSNorm(hidden, eps)                      # input_layernorm
        self.qkv = nn.Linear(hidden, (config.num_heads + 2 * config.num_kv_heads) * hd,
                             bias=config.attention_bias)
        self.q_norm = GemmaRMSNorm(hd, eps)
        self.k_norm = GemmaRMSNorm(hd, eps)
        self.attn_out = nn.Linear(config.num_heads * hd, hidden, bias=config.attention_bias)
        self.post_attn_norm = GemmaRMSNorm(hidden, eps)                 # post_attention_layernorm
        self.mlp_norm = GemmaRMSNorm(hidden, eps)                       # pre_feedforward_layernorm
        self.gate_up = nn.Linear(hidden, 2 * config.intermediate_size, bias=False)
        self.down = nn.Linear(config.intermediate_size, hidden, bias=False)
        self.post_mlp_norm = GemmaRMSNorm(hidden, eps)                  # post_feedforward_layernorm
        # SDPA scales by 1/sqrt(head_dim); Gemma by 1/sqrt(query_pre_attn_scalar).
        self.query_scale = math.sqrt(hd / config.query_pre_attn_scalar)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, attend: Attend,
                kind: AttentionKind | None) -> torch.Tensor:
        # x: [T, hidden]; cos, sin: [T, 1, hd]
        tokens = x.shape[0]
        qkv = self.qkv(self.attn_norm(x)).view(tokens, -1, self.head_dim)
        q, k, v = qkv.split([self.num_heads, self.num_kv_heads, self.num_kv_heads], dim=1)
        q, k = rotate(self.q_norm(q), cos, sin), rotate(self.k_norm(k), cos, sin)
        if self.query_scale != 1.0:
            q = q * self.query_scale
        groups = self.num_heads // self.num_kv_heads
        if groups > 1:
            k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
        context = attend(q.contiguous(), k.contiguous(), v.contiguous(), kind)   # [T, heads, hd]
        x = x + self.post_attn_norm(self.attn_out(context.reshape(tokens, -1).contiguous()))
        gate, up = self.gate_up(self.mlp_norm(x)).chunk(2, dim=-1)
        return x + self.post_mlp_norm(self.down(F.gelu(gate, approximate="tanh") * up))


class Gemma3Model(nn.Module):
    """Token ids in, final (normed) hidden states out: [T] -> [T, hidden] (EncoderModel's
    signature; ``token_type_ids`` ignored: no segments)."""

    head: nn.Module | None = None          # an embedder: no classification head

    def __init__(self, config: Gemma3Config) -> None:
        super().__init__()
        self.config = config
        self.attention_kind = AttentionKind(causal=not config.bidirectional)
        self.sliding_kind = AttentionKind(causal=not config.bidirectional, window=config.window)
        self.embed = embedding_table(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(Layer(config) for _ in range(config.num_layers))
        self.norm = GemmaRMSNorm(config.hidden_size, config.rms_norm_eps)

    def forward(self, token_ids: torch.Tensor, position_ids: torch.Tensor,
                token_type_ids: torch.Tensor, attend: Attend) -> torch.Tensor:
        config = self.config
        x = self.embed(token_ids)
        # transformers multiplies by sqrt(hidden) cast to the weights' dtype first.
        x = x * torch.tensor(config.hidden_size ** 0.5, dtype=x.dtype)          # [T, hidden]
        thetas = {FULL: config.global_rope_theta, SLIDING: config.local_rope_theta}
        rope = {kind: rotary_tables(position_ids, config.head_dim, thetas[kind], x.dtype)
                for kind in set(config.layer_types)}
        kinds = {FULL: None, SLIDING: self.sliding_kind}
        for layer, layer_type in zip(self.layers, config.layer_types):
            x = layer(x, *rope[layer_type], attend, kinds[layer_type])
        return self.norm(x)

    def score(self, cls_states: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError("Gemma3 is served as an embedder only")
