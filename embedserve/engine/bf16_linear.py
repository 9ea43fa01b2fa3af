"""The fused CPU layers' bf16 linears on CPUs with AVX512-BF16 but no AMX.

Owns deciding whether a linear goes to the native kernel (``engine/csrc/bf16_linear.c``,
built at install where the compiler targets AVX512-BF16) and keeping its weight in
the kernel's panel layout, in place of oneDNN's. Why: on such a CPU (AMD Zen 4 and
later) oneDNN's bf16 matmul runs a short query's few dozen rows at well under half of
the VDPBF16PS rate; the kernel is 1.4-2x faster there and level or ahead at 512 rows
(``python -m bench native_linears``). It keeps no state per row count. With AMX, oneDNN's
tile kernels keep every call; float32 is avx2_linear's or oneDNN's.
"""

from __future__ import annotations

import functools
from types import ModuleType

import torch

from embedserve.engine import profiler_names

try:
    from embedserve.engine import _bf16_linear as _native  # type: ignore[attr-defined]  # C extension
except ImportError:          # not built: no compiler, or one that cannot target AVX512-BF16
    _native = None

PANEL = 32                   # output columns per panel (two 16-float AVX-512 accumulators)
# The native linear's ``threads`` that runs a call on the calling thread and the kernel's
# own helper thread, not torch's OpenMP team (csrc/helper_team.h says why).
HELPER_TEAM = 0


@functools.cache
def kernel_runs_here() -> bool:
    """Whether the kernel is built and this CPU has AVX512-BF16, whether or not layers take it."""
    return _native is not None and torch.cpu._is_avx512_bf16_supported()


@functools.cache
def kernel_available() -> bool:
    """Whether layers take the kernel: it runs here and the CPU has no AMX."""
    return kernel_runs_here() and not torch.cpu._is_amx_tile_supported()


def covers(weight: torch.Tensor) -> bool:
    """Whether ``weight`` ([out, in]) can take the kernel: bf16 on CPU, ``out`` a multiple of
    32, ``in`` even."""
    return (kernel_available() and weight.dtype == torch.bfloat16 and weight.device.type == "cpu"
            and weight.dim() == 2 and weight.shape[0] % PANEL == 0 and weight.shape[1] % 2 == 0)


def pack_panels(weight: torch.Tensor) -> torch.Tensor:
    """``weight`` [out, in] as the kernel reads it: [out / 32, in / 2, 32, 2], contiguous."""
    out_features, in_features = weight.shape
    return (weight.detach().reshape(out_features // PANEL, PANEL, in_features // 2, 2)
            .permute(0, 2, 1, 3).contiguous())


# oneDNN's epilogue names (attr, algorithm) -> the kernel's activation code
ACTIVATIONS = {("none", ""): 0, ("gelu", "none"): 1, ("gelu", "tanh"): 2, ("relu", ""): 3}


def linear(x: torch.Tensor, panels: torch.Tensor, bias: torch.Tensor, attr: str = "none",
           algorithm: str = "") -> torch.Tensor:
    """``activation(x @ W.T + bias)`` for x [rows, in] bf16; ``panels`` from pack_panels,
    ``bias`` float32; the activation named as oneDNN's epilogues are (``ACTIVATIONS``).

    Accumulates in float32 from the bias, applies the activation, rounds each output once to bf16.
    """
    if x.stride(1) != 1 or x.stride(0) % 2 or x.data_ptr() % 4:
        x = x.contiguous()
    return run_panel_kernel(_native, profiler_names.BF16_LINEAR, x, panels, bias, attr, algorithm)


def run_panel_kernel(native: ModuleType, profiler_name: str, x: torch.Tensor, panels: torch.Tensor, bias: torch.Tensor,
                     attr: str, algorithm: str) -> torch.Tensor:
    """A new bf16 ``activation(x @ W.T + bias)`` from ``native.linear``: this module's kernel
    or amx_linear's, which take the same arguments (x's rows as the kernel needs them)."""
    rows, in_features = x.shape
    out_features = panels.shape[0] * PANEL
    y = torch.empty(rows, out_features, dtype=torch.bfloat16)
    with profiler_names.named(profiler_name):
        native.linear(x.data_ptr(), panels.data_ptr(), bias.data_ptr(), y.data_ptr(), rows,
                      out_features, in_features, x.stride(0), torch.get_num_threads(),
                      ACTIVATIONS[attr, algorithm])
    return y
