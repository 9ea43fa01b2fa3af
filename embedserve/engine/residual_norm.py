"""LayerNorm(y + residual) as one pass over bf16 rows, for the fused CPU layers.

Owns choosing, per call, between the native kernel (``engine/csrc/add_layer_norm.c``,
built at install where the compiler can target AVX-512 BF16) and torch's two ops
(``add_`` then the LayerNorm). The kernel reads each row once, keeps the sum in
float32 and writes the normalized row over ``y``; torch's ops read and write the
activations twice and round the sum to bf16 in between (about 11% of a bf16 step:
``python -m bench engine_profile``).
"""

from __future__ import annotations

import functools

import torch
from torch import nn

from embedserve.engine import profiler_names

try:
    from embedserve.engine import _add_layer_norm as _native  # type: ignore[attr-defined]  # C extension
except ImportError:          # not built: no compiler, or one that cannot target AVX-512 BF16
    _native = None

LARGEST_HIDDEN = 8192        # the kernel's per-thread row buffer


@functools.cache
def kernel_available() -> bool:
    """Whether the kernel is built and the CPU has AVX-512 BF16."""
    return _native is not None and torch.cpu._is_avx512_bf16_supported()


class ResidualNorm(nn.Module):
    """``norm(y + residual)``, in place of ``y`` where the native kernel covers the call."""

    def __init__(self, norm: nn.LayerNorm) -> None:
        super().__init__()
        self.norm = norm
        (hidden,) = norm.normalized_shape
        weight = norm.weight.detach().float() if norm.weight is not None else torch.ones(hidden)
        bias = norm.bias.detach().float() if norm.bias is not None else torch.zeros(hidden)
        # float32 copies made once: the kernel scales in float32.
        self.register_buffer("weight32", weight.contiguous(), persistent=False)
        self.register_buffer("bias32", bias.contiguous(), persistent=False)
        self.native = hidden % 16 == 0 and hidden <= LARGEST_HIDDEN and kernel_available()

    def forward(self, y: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        # y, residual: [T, hidden]; y may be overwritten
        if not (self.native and y.dtype == residual.dtype == torch.bfloat16 and y.device.type == "cpu"
                and y.stride(1) == 1 and residual.stride(1) == 1 and y.shape == residual.shape):
            return self.norm(y.add_(residual))
        rows, hidden = y.shape
        with profiler_names.named(profiler_names.ADD_LAYER_NORM):
            _native.add_layer_norm(y.data_ptr(), residual.data_ptr(), self.weight32.data_ptr(),  # type: ignore[operator]  # buffers
                                   self.bias32.data_ptr(), rows, hidden, y.stride(0), residual.stride(0),  # type: ignore[operator]
                                   self.norm.eps, torch.get_num_threads())
        return y
