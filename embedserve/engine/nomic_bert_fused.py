"""NomicBERT's layers on oneDNN-packed weights: onednn.py's CPU transform for this family.

Owns swapping each modules/nomic_bert.py ``Layer`` for a ``FusedLayer`` computing the
same function with onednn.py's ``PackedWeight`` (weights reordered once at load, or a
native kernel's panels where one covers them) and residual_norm.py's ``ResidualNorm``
(the residual add and the post-norm in one pass in bf16). The SwiGLU product and the
rotary angles stay torch ops: oneDNN has no epilogue for a gated unit.
Knows nothing about batching or attention; CUDA models are never transformed.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from embedserve.engine.modules.attention import Attend
from embedserve.engine.modules.decoder import rotate
from embedserve.engine.modules.nomic_bert import Layer, NomicBertModel
from embedserve.engine.onednn import PackedWeight, supported
from embedserve.engine.residual_norm import ResidualNorm


class FusedLayer(nn.Module):
    """nomic_bert.Layer's math (post-norm, rotary, SwiGLU) on packed weights."""

    def __init__(self, layer: Layer, native_linears: bool = True) -> None:
        super().__init__()
        self.num_heads, self.head_dim = layer.num_heads, layer.head_dim
        self.qkv = PackedWeight(layer.qkv, native_linears)
        self.attn_out = PackedWeight(layer.attn_out, native_linears)
        self.attn_norm = ResidualNorm(layer.attn_norm)
        self.mlp_in = PackedWeight(layer.mlp_in, native_linears)
        self.mlp_out = PackedWeight(layer.mlp_out, native_linears)
        self.mlp_norm = ResidualNorm(layer.mlp_norm)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, attend: Attend) -> torch.Tensor:
        # x: [T, hidden]; cos, sin: [T, 1, hd]
        tokens = x.shape[0]
        qkv = self.qkv(x).view(tokens, 3, self.num_heads, self.head_dim)
        q, k = rotate(qkv[:, 0], cos, sin), rotate(qkv[:, 1], cos, sin)
        context = attend(q, k, qkv[:, 2].contiguous())                          # [T, heads, hd]
        x = self.attn_norm(self.attn_out(context.reshape(tokens, -1).contiguous()), x)
        value, gate = self.mlp_in(x).chunk(2, dim=-1)
        return self.mlp_norm(self.mlp_out((value * F.silu(gate)).contiguous()), x)


def fuse_nomic_layers(model: NomicBertModel, native_linears: bool = True) -> bool:
    """Swap the model's layers for FusedLayers in place; False (unchanged) if this CPU
    and dtype cannot run them. Call after the model has its final dtype (CPU)."""
    if not supported(next(model.parameters()).dtype):
        return False
    for i, layer in enumerate(model.layers):
        model.layers[i] = FusedLayer(layer, native_linears)  # type: ignore[arg-type]
    return True
