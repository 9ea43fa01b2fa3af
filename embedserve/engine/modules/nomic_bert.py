"""The NomicBERT encoder family on packed tokens (nomic-embed-text-v1 / v1.5).

One readable module, like bert.py: word + segment embeddings and a norm,
then post-norm layers (x = LN(x + attn(x)); x = LN(x + mlp(x))) whose
attention rotates q and k by each token's position in its own sequence
(rotary, base ``rope_theta``; no position table) and whose feed-forward is
SwiGLU: fc2(fc11(x) * silu(fc12(x))). Attention is the ``Attend`` the runner
passes (attention.py / varlen_attention.py), exactly as for BERT.
Knows nothing about files, batching or devices.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from embedserve.engine.modules.attention import BIDIRECTIONAL, Attend, AttentionKind
from embedserve.engine.modules.bert import embedding_table
from embedserve.engine.modules.decoder import rotary_tables, rotate
from embedserve.model.nomic_bert_config import NomicBertConfig


class Layer(nn.Module):
    def __init__(self, config: NomicBertConfig) -> None:
        super().__init__()
        hidden = config.hidden_size
        self.num_heads, self.head_dim = config.num_heads, config.head_dim
        self.qkv = nn.Linear(hidden, 3 * hidden, bias=config.qkv_bias)          # Wqkv
        self.attn_out = nn.Linear(hidden, hidden, bias=config.qkv_bias)         # out_proj
        self.attn_norm = nn.LayerNorm(hidden, eps=config.layer_norm_eps)        # norm1
        # fc11 (value) and fc12 (gate) in one matmul: [value | gate]
        self.mlp_in = nn.Linear(hidden, 2 * config.intermediate_size, bias=config.mlp_fc1_bias)
        self.mlp_out = nn.Linear(config.intermediate_size, hidden, bias=config.mlp_fc2_bias)
        self.mlp_norm = nn.LayerNorm(hidden, eps=config.layer_norm_eps)         # norm2

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, attend: Attend) -> torch.Tensor:
        # x: [T, hidden]; cos, sin: [T, 1, hd]
        tokens = x.shape[0]
        qkv = self.qkv(x).view(tokens, 3, self.num_heads, self.head_dim)
        q, k = rotate(qkv[:, 0], cos, sin), rotate(qkv[:, 1], cos, sin)
        context = attend(q, k, qkv[:, 2].contiguous())                          # [T, heads, hd]
        x = self.attn_norm(x + self.attn_out(context.reshape(tokens, -1)))
        value, gate = self.mlp_in(x).chunk(2, dim=-1)
        return self.mlp_norm(x + self.mlp_out(value * F.silu(gate)))


class NomicBertModel(nn.Module):
    """Token ids in, final hidden states out: [T] -> [T, hidden] (EncoderModel's signature)."""

    head: nn.Module | None = None          # an embedder: no classification head
    attention_kind: AttentionKind = BIDIRECTIONAL

    def __init__(self, config: NomicBertConfig) -> None:
        super().__init__()
        self.config = config
        self.word = embedding_table(config.vocab_size, config.hidden_size)
        self.token_type = embedding_table(config.type_vocab_size, config.hidden_size)
        self.embed_norm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.layers = nn.ModuleList(Layer(config) for _ in range(config.num_layers))

    def forward(self, token_ids: torch.Tensor, position_ids: torch.Tensor,
                token_type_ids: torch.Tensor, attend: Attend) -> torch.Tensor:
        x = self.embed_norm(self.word(token_ids) + self.token_type(token_type_ids))   # [T, hidden]
        cos, sin = rotary_tables(position_ids, self.config.head_dim, self.config.rope_theta, x.dtype)
        for layer in self.layers:
            x = layer(x, cos, sin, attend)
        return x

    def score(self, cls_states: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError("NomicBERT is served as an embedder only")
