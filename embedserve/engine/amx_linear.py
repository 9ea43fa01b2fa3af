"""The fused CPU layers' bf16 linears of few rows on AMX tiles.

Owns deciding whether a model's linears get the native kernel for calls of up to
``MAX_ROWS`` rows (``engine/csrc/amx_linear.c``, built at install where the compiler
targets AMX) and calling it. Why: on AMX CPUs oneDNN keeps every linear (its tile
kernels are the fastest at hundreds of rows), but a call of a few rows costs it ~40 us
whatever the weight, so the 48 linears of a short query's step took ~1.7-2.7 ms against
~0.85-1.6 on the kernel, about what streaming their weights takes (``python -m bench
native_linears``, AMX section).
The kernel reads bf16_linear.py's panels, a second copy of each weight beside oneDNN's
(whose packed layout is opaque), so a model takes it only while its linears' weights
are at most ``MAX_WEIGHT_BYTES``: the copy costs as much memory again, and in a large
model the weights' stream, not the per-call cost, is what a short step waits on.
"""

from __future__ import annotations

import functools

import torch

from embedserve.engine import profiler_names
from embedserve.engine.bf16_linear import PANEL, run_panel_kernel
from embedserve.engine.modules import bf16_attention

try:
    from embedserve.engine import _amx_linear as _native  # type: ignore[attr-defined]  # C extension
except ImportError:          # not built: no compiler, or one that cannot target AMX
    _native = None

# Calls of up to this many rows take the kernel. Measured against oneDNN's AMX matmul on
# the 48 linears of one multilingual-e5-small step (2 threads, Xeon with AMX, quiet):
# 1.7-1.8x at 1-16 rows, 1.3x at 32, 1.2x at 64; level above (BENCHMARKS.md).
MAX_ROWS = 64
# A model's linears take the kernel while their weights are at most this large (bf16
# bytes): multilingual-e5-small's are 42 MB, a base-size encoder's ~170 MB.
MAX_WEIGHT_BYTES = 256 << 20
K_STEP = 32                  # input columns per tile product


@functools.cache
def kernel_available() -> bool:
    """Whether the kernel is built and this process runs AMX tiles (granted by Linux)."""
    return _native is not None and bf16_attention.kernel_path() == bf16_attention.AMX


def covers(weight: torch.Tensor) -> bool:
    """Whether ``weight`` ([out, in]) can take the kernel: bf16 on CPU, ``out`` a multiple of
    32, ``in`` a multiple of 32."""
    return (kernel_available() and weight.dtype == torch.bfloat16 and weight.device.type == "cpu"
            and weight.dim() == 2 and weight.shape[0] % PANEL == 0 and weight.shape[1] % K_STEP == 0)


def linear(x: torch.Tensor, panels: torch.Tensor, bias: torch.Tensor, attr: str = "none",
           algorithm: str = "") -> torch.Tensor:
    """``activation(x @ W.T + bias)`` for x [rows, in] bf16 (rows <= ``MAX_ROWS``), ``panels``
    from ``bf16_linear.pack_panels``, ``bias`` float32; the activation named as oneDNN's
    epilogues are. Sums in float32, adds the bias, applies the activation, rounds once."""
    if x.stride(1) != 1:
        x = x.contiguous()
    return run_panel_kernel(_native, profiler_names.AMX_LINEAR, x, panels, bias, attr, algorithm)
