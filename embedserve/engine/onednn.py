"""A CPU speed-up applied after the model is built: oneDNN-packed, fused layers.

Owns swapping each encoder ``Layer`` for a ``FusedLayer`` that computes the
same function with oneDNN (the library behind ``torch.backends.mkldnn``):

- every weight is reordered once, at load, into oneDNN's blocked layout
  (``addmm`` re-reads the plain weight and first copies the bias into its
  output on every call);
- the feed-forward GELU runs in the first matmul's epilogue, so its
  activation is written once; the residuals are added in place into the
  projections' outputs (oneDNN's binary-add epilogue measured 5-18% slower
  in bf16), and in bf16 together with the LayerNorm that follows, in one pass
  (residual_norm.py);
- in bfloat16 the matmuls run on AMX / AVX512-BF16 where the CPU has them,
  and activations stay bfloat16 between layers (where bf16 time goes:
  ``python -m bench engine_profile``);
- where a native kernel covers a linear (avx2_linear in float32 on AVX2-only
  CPUs, bf16_linear in bf16 on AVX512-BF16 CPUs without AMX), it runs there
  instead, on weights packed into the kernel's panels;
- on AMX CPUs, calls of few rows (a short query's step) run on amx_linear, on a
  second copy of the weight in bf16_linear's panels, where the model is small
  enough (amx_linear.py says why and which).

Measured on the project's 2-core CPU (BENCHMARKS.md, engine section). The
math is unchanged up to float rounding (the parity tests run on this path).
Knows nothing about batching or attention: the layer still calls the
``Attend`` function it is given. CUDA models are never transformed.
"""

from __future__ import annotations

import sys
from typing import cast

import torch
from torch import nn

from embedserve.engine import amx_linear, avx2_linear, bf16_linear, int8_linear
from embedserve.engine.modules.bert import Attend, EncoderModel, Layer
from embedserve.engine.residual_norm import ResidualNorm

_mkldnn = torch.ops.mkldnn
# oneDNN epilogues for the activations the encoder family uses: (attr, algorithm).
_FUSED_ACTIVATIONS = {"gelu": ("gelu", "none"), "gelu_new": ("gelu", "tanh"),
                      "gelu_pytorch_tanh": ("gelu", "tanh"), "relu": ("relu", "")}
# Token count oneDNN tunes the packed layout for; any count runs correctly.
_TOKEN_HINT = 512
# Native linear kernels, each a module with covers(weight), pack_panels(weight) and
# linear(x, panels, float32 bias, attr, algorithm), the activation named as oneDNN's
# epilogues are; at most one covers a given weight (dtype and CPU differ).
_NATIVE_KERNELS = (avx2_linear, bf16_linear)


def supported(dtype: torch.dtype) -> bool:
    """Whether this torch build and CPU can run the fused layers in ``dtype``."""
    if not (torch.backends.mkldnn.is_available() and torch.backends.mkldnn.enabled):
        return False
    if dtype == torch.float32:
        return True
    return dtype == torch.bfloat16 and bool(_mkldnn._is_mkldnn_bf16_supported())


class PackedWeight(nn.Module):
    """One linear layer's weight, packed once for what runs it (oneDNN's layout, or a
    native kernel's panels where one covers it), plus its bias."""

    def __init__(self, linear: nn.Linear, native: bool = True, few_rows: bool = False) -> None:
        """``few_rows``: calls of up to ``amx_linear.MAX_ROWS`` rows run on amx_linear where it
        covers the weight and oneDNN runs the rest (``fuse_layers`` decides per model)."""
        super().__init__()
        weight = linear.weight.detach()
        bias = None if linear.bias is None else linear.bias.detach()
        covering = (kernel for kernel in _NATIVE_KERNELS if kernel.covers(weight))
        self.kernel = next(covering, None) if native else None
        # The kernels always add a bias, in float32.
        bias32 = (bias if bias is not None else weight.new_zeros(weight.shape[0])).float()
        if self.kernel is not None:
            self.register_buffer("weight", self.kernel.pack_panels(weight))
            self.register_buffer("bias", bias32)
        else:
            self.register_buffer("weight", _mkldnn._reorder_linear_weight(weight, _TOKEN_HINT))
            self.register_buffer("bias", bias)
        self.few_rows = (native and few_rows and self.kernel is None and amx_linear.covers(weight))
        if self.few_rows:
            self.register_buffer("few_rows_panels", bf16_linear.pack_panels(weight))
            self.register_buffer("few_rows_bias", bias32)

    @property
    def native(self) -> bool:
        """Whether a native kernel runs this weight (else oneDNN)."""
        return self.kernel is not None

    def forward(self, x: torch.Tensor, attr: str = "none", algorithm: str = "") -> torch.Tensor:
        # x: [T, in] contiguous -> [T, out]
        if self.kernel is not None:
            return self.kernel.linear(x, self.weight, self.bias, attr, algorithm)
        if self.few_rows and x.shape[0] <= amx_linear.MAX_ROWS:
            return amx_linear.linear(x, cast(torch.Tensor, self.few_rows_panels),
                                     cast(torch.Tensor, self.few_rows_bias), attr, algorithm)
        return _mkldnn._linear_pointwise(x, self.weight, self.bias, attr, [], algorithm)


class FusedLayer(nn.Module):
    """encoder.Layer's math (post-norm) on packed weights with fused epilogues."""

    def __init__(self, layer: Layer, hidden_act: str, native_linears: bool = True, few_rows: bool = False) -> None:
        super().__init__()
        self.num_heads = layer.num_heads
        self.head_dim = layer.head_dim
        self.qkv = PackedWeight(layer.qkv, native_linears, few_rows)
        self.attn_out = PackedWeight(layer.attn_out, native_linears, few_rows)
        self.attn_norm = ResidualNorm(layer.attn_norm)
        self.ffn_in = PackedWeight(layer.ffn_in, native_linears, few_rows)
        self.ffn_out = PackedWeight(layer.ffn_out, native_linears, few_rows)
        self.ffn_norm = ResidualNorm(layer.ffn_norm)
        self.activation = _FUSED_ACTIVATIONS[hidden_act]

    def forward(self, x: torch.Tensor, attend: Attend) -> torch.Tensor:
        # x: [T, hidden]
        tokens = x.shape[0]
        qkv = self.qkv(x).view(tokens, 3, self.num_heads, self.head_dim)   # [T, 3, heads, hd]
        context = attend(qkv[:, 0], qkv[:, 1], qkv[:, 2])                  # [T, heads, hd]
        x = self.attn_norm(self.attn_out(context.reshape(tokens, -1).contiguous()), x)
        return self.ffn_norm(self.ffn_out(self.ffn_in(x, *self.activation)), x)


def fuse_layers(model: EncoderModel, native_linears: bool = True) -> bool:
    """Swap the encoder's layers for FusedLayers in place; False (unchanged) if unsupported.

    Call after the model has its final dtype and device (CPU). native_linears: where
    a native kernel covers a weight, run it there; False keeps oneDNN (benchmarks A/B).
    """
    config = model.config
    dtype = next(model.parameters()).dtype
    if config.hidden_act not in _FUSED_ACTIVATIONS or not supported(dtype):
        return False
    layers = model.encoder.layers
    few_rows = native_linears and few_rows_kernel_fits(layers)
    for i, layer in enumerate(layers):
        layers[i] = FusedLayer(layer, config.hidden_act, native_linears, few_rows)  # type: ignore[arg-type]  # a Layer
    return True


def few_rows_kernel_fits(layers: nn.ModuleList) -> bool:
    """Whether the encoder's linears get amx_linear's copy for calls of few rows: the kernel
    runs here and their bf16 weights are at most ``amx_linear.MAX_WEIGHT_BYTES``."""
    if not amx_linear.kernel_available():
        return False
    linears = [module for module in layers.modules() if isinstance(module, nn.Linear)]
    return sum(linear.weight.numel() * 2 for linear in linears) <= amx_linear.MAX_WEIGHT_BYTES


def linears_all_native(model: nn.Module) -> bool:
    """Whether every linear over the model's tokens runs on a native kernel (all its
    layers FusedLayers with native weights), which keeps no state per row count; oneDNN
    builds and keeps a primitive per count (cpu_shapes.py)."""
    packed = _token_linears(model)
    return bool(packed) and all(isinstance(module, PackedWeight) and module.native for module in packed)


def linears_native_up_to(model: nn.Module) -> int:
    """The most rows a call may have for every linear over the model's tokens to run on a
    native kernel, which keeps no state per row count: unbounded where all are native
    (``linears_all_native``), ``amx_linear.MAX_ROWS`` where the rest have amx_linear's copy
    for few rows (and ``--dtype int8``'s linears int8_linear's), else 0."""
    packed = _token_linears(model)
    return min((_native_up_to(module) for module in packed), default=0)


def _native_up_to(module: nn.Module) -> int:
    # one of _token_linears' modules: a PackedWeight or an Int8Weight
    if isinstance(module, PackedWeight):
        if module.native:
            return sys.maxsize
        return amx_linear.MAX_ROWS if module.few_rows else 0
    if getattr(module, "per_row", False):
        return sys.maxsize                      # int8_linear's kernel at every size
    return int8_linear.max_rows() if getattr(module, "few_rows", False) else 0


def _token_linears(model: nn.Module) -> list[nn.Module]:
    """The model's PackedWeights and Int8Weights (``--dtype int8``), where they are all the
    linears over its tokens (an encoder whose layers are all fused or int8); else empty."""
    from embedserve.engine.int8_layers import Int8Weight  # int8_layers imports this module

    encoder = getattr(model, "encoder", None)
    if encoder is None or any(isinstance(module, nn.Linear) for module in encoder.modules()):
        return []
    return [module for module in model.modules() if isinstance(module, PackedWeight | Int8Weight)]
