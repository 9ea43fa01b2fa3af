"""Padding-free attention on CUDA: one fused variable-length kernel call per layer.

Owns calling PyTorch's ``torch.nn.attention.varlen.varlen_attn`` (FlashAttention
over ``cu_seqlens``) for a packed batch, so attention costs the sum of each
sequence's L squared, never the batch's T squared, and no score tensor is ever
materialized. ``cu_seqlens`` is computed on the device from the bucket's
``lengths`` row (graphs/buckets.py), and the maximum length is a Python int
fixed per bucket, so a captured graph replays for any mix of lengths that fits
its bucket.

The kernel runs float16 and bfloat16 on CUDA only; float32 steps keep the
static masked layouts of attention.py. Kinds map to the kernel's
``window_size = (left, right)``: bidirectional (-1, -1), causal (-1, 0),
sliding window w (w, w), causal sliding window (w, 0). PyTorch releases whose
``varlen_attn`` has only ``is_causal`` cover the first two kinds.

Where the kernel takes ``enable_gqa``, grouped-query models pass their k/v with
fewer heads than q (``VarlenAttend.grouped_heads``) instead of repeating them, and
where it takes ``window_size`` a windowed layer (ModernBERT's local layers) asks
this same call for its window (``VarlenAttend.windowed``) instead of a banded mask.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import torch

from embedserve.engine.modules.attention import AttentionKind

VarlenKernel = Callable[..., torch.Tensor]
HALF_DTYPES = (torch.float16, torch.bfloat16)


def torch_kernel() -> VarlenKernel | None:
    """PyTorch's varlen kernel, or None where this PyTorch has none."""
    try:
        from torch.nn.attention.varlen import varlen_attn
    except ImportError:
        return None
    return varlen_attn  # type: ignore[return-value]  # returns a Tensor without return_aux


def covers(dtype: torch.dtype, device: torch.device | str) -> bool:
    """Can the fused kernel run a model of this dtype on this device?"""
    return torch.device(device).type == "cuda" and dtype in HALF_DTYPES and torch_kernel() is not None


def window_size(kind: AttentionKind) -> tuple[int, int]:
    """The kernel's (left, right) reach for ``kind``; -1 is unlimited."""
    left = -1 if kind.window is None else kind.window
    return (left, 0) if kind.causal else (left, left)


def kind_arguments(kernel: VarlenKernel, kind: AttentionKind) -> dict[str, Any]:
    """Keyword arguments that ask ``kernel`` for ``kind``, by the parameters it takes."""
    parameters = inspect.signature(kernel).parameters
    if "window_size" in parameters:
        return {"window_size": window_size(kind)}
    if "is_causal" in parameters and kind.window is None:
        return {"is_causal": kind.causal}
    raise ValueError(f"this PyTorch's varlen_attn cannot run {kind}")


def takes(kernel: VarlenKernel, parameter: str) -> bool:
    """Does ``kernel`` take the keyword ``parameter``?"""
    return parameter in inspect.signature(kernel).parameters


def cu_seqlens_from_lengths(lengths: torch.Tensor) -> torch.Tensor:
    """int32 [R + 1]: 0, then each row's end; static shape for a fixed R."""
    return torch.nn.functional.pad(lengths.cumsum(0), (1, 0)).to(torch.int32)


class VarlenAttend:
    """An ``Attend`` over one step's rows through the varlen kernel.

    grouped_heads: k and v may have fewer heads than q (a divisor of them), as
    grouped-query models make them. windowed: ``kind=`` may ask for a window.
    """

    def __init__(self, kernel: VarlenKernel, cu_seqlens: torch.Tensor, max_length: int,
                 default: AttentionKind) -> None:
        self._kernel = kernel
        self._cu_seqlens = cu_seqlens
        self._max_length = max_length
        self._default = default
        self._arguments: dict[AttentionKind, dict[str, Any]] = {}
        self.grouped_heads = takes(kernel, "enable_gqa")
        self.windowed = takes(kernel, "window_size")

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                 kind: AttentionKind | None = None, quantized: bool = False) -> torch.Tensor:
        kind = kind or self._default
        if kind not in self._arguments:
            self._arguments[kind] = kind_arguments(self._kernel, kind)
        extra = {"enable_gqa": True} if k.shape[1] != q.shape[1] else {}
        return self._kernel(q, k, v, self._cu_seqlens, self._cu_seqlens, self._max_length,
                            self._max_length, **self._arguments[kind], **extra)


def varlen_from_lengths(lengths: torch.Tensor, max_length: int, causal: bool = False,
                        window: int | None = None, kernel: VarlenKernel | None = None) -> VarlenAttend:
    """Attend over rows of ``lengths`` tokens each (packed back to back, in order).

    ``max_length`` must be at least the longest row: the kernel launches blocks for
    that many queries per row, so a bucket passes the longest a row can be (its
    token count, or the model's positions when fewer). Rows of length 0 are allowed.
    ``kernel`` defaults to PyTorch's.
    """
    kernel = kernel or torch_kernel()
    if kernel is None:
        raise RuntimeError("this PyTorch has no torch.nn.attention.varlen")
    return VarlenAttend(kernel, cu_seqlens_from_lengths(lengths), max_length, AttentionKind(causal, window))
