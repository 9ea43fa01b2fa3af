"""The fused CPU layers' float32 linears on CPUs whose widest vectors are AVX2.

Owns deciding whether a linear goes to the native kernel (``engine/csrc/avx2_linear.c``,
built at install where the compiler targets AVX2 and FMA) and keeping its weight in
the kernel's panel layout, in place of oneDNN's. Why: a short query is a step of a
few dozen tokens, and there oneDNN's float32 matmul without AVX-512 runs at about
half of the FMA rate; the 48 linears of multilingual-e5-small are most of such a step.
From ~128 tokens up the two are level (``python -m bench native_linears``). The kernel
also keeps no state per row count, so these steps need no token buckets
(cpu_shapes.py). With AVX-512, and in bf16, oneDNN keeps every call.
"""

from __future__ import annotations

import functools

import torch

from embedserve.engine import profiler_names

try:
    from embedserve.engine import _avx2_linear as _native  # type: ignore[attr-defined]  # C extension
except ImportError:          # not built: no compiler, or one that cannot target AVX2
    _native = None

PANEL = 16                   # output columns per panel (two 8-float AVX2 registers)


@functools.cache
def kernel_runs_here() -> bool:
    """Whether the kernel is built and this CPU has AVX2 and FMA, whether or not layers take it."""
    return _native is not None and torch.backends.cpu.get_cpu_capability() in ("AVX2", "AVX512")


@functools.cache
def kernel_available() -> bool:
    """Whether layers take the kernel: it runs here and AVX2 is the widest vector unit torch found."""
    return kernel_runs_here() and torch.backends.cpu.get_cpu_capability() == "AVX2"


def covers(weight: torch.Tensor) -> bool:
    """Whether ``weight`` ([out, in]) can take the kernel: float32 on CPU, ``out`` a multiple of 16."""
    return (kernel_available() and weight.dtype == torch.float32 and weight.device.type == "cpu"
            and weight.dim() == 2 and weight.shape[0] % PANEL == 0)


def pack_panels(weight: torch.Tensor) -> torch.Tensor:
    """``weight`` [out, in] as the kernel reads it: [out / 16, in, 16], contiguous."""
    out_features, in_features = weight.shape
    return weight.detach().reshape(out_features // PANEL, PANEL, in_features).transpose(1, 2).contiguous()


# oneDNN's epilogue names (attr) -> the same activation after the kernel, in place: (y, algorithm) -> y.
_ACTIVATIONS_IN_PLACE = {"none": lambda y, algorithm: y,
                         "gelu": lambda y, algorithm: torch.ops.aten.gelu_(y, approximate=algorithm),
                         "relu": lambda y, algorithm: y.relu_()}


def linear(x: torch.Tensor, panels: torch.Tensor, bias: torch.Tensor, attr: str = "none",
           algorithm: str = "") -> torch.Tensor:
    """``activation(x @ W.T + bias)`` for x [rows, in] float32 with unit column stride; ``panels``
    from pack_panels; the activation named as oneDNN's epilogues are, applied after the kernel
    (in float32 that rounds nothing it would not)."""
    if x.stride(1) != 1:
        x = x.contiguous()
    rows, in_features = x.shape
    out_features = panels.shape[0] * PANEL
    y = torch.empty(rows, out_features, dtype=torch.float32)
    with profiler_names.named(profiler_names.AVX2_LINEAR):
        _native.linear(x.data_ptr(), panels.data_ptr(), bias.data_ptr(), y.data_ptr(), rows,
                       out_features, in_features, x.stride(0), torch.get_num_threads())
    return _ACTIVATIONS_IN_PLACE[attr](y, algorithm)
