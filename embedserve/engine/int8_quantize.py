"""Activations to uint8 for the int8 linears (int8_layers.py): ranges, scales, one pass.

Owns the affine mapping ``q = clamp(round(x * multiplier) + zero_point, 0, qmax)``
(oneDNN's convention for a uint8 source; ``multiplier`` is float32 [n], ``1 / scale``
per column, divided by the column's smoothing factor where int8_layers.py smooths)
and running it: the native kernel
(``engine/csrc/int8_quantize.c``, built at install where the compiler targets
AVX-512) reads bf16 or float32 rows once and writes uint8; without it torch's
element-wise ops do the same in several passes (correct, slower).
"""

from __future__ import annotations

import functools

import torch

from embedserve.engine.dtype_choice import cpu_capabilities

try:
    from embedserve.engine import _int8_quantize as _native  # type: ignore[attr-defined]  # C extension
except ImportError:          # not built: no compiler, or one that cannot target AVX-512
    _native = None

# uint8's full range, and the 7-bit one for CPUs without VNNI: there oneDNN multiplies
# uint8 by int8 with VPMADDUBSW, whose int16 sum of two products saturates
# (2 x 255 x 127 > 32767), as torch's x86 quantizer's ``reduce_range`` avoids.
FULL_RANGE = 255
REDUCED_RANGE = 127
_VNNI_FEATURES = ("amx_int8", "avx512_vnni", "avx_vnni")


@functools.cache
def kernel_available() -> bool:
    """Whether the kernel is built and the CPU has AVX-512 (F + BW)."""
    if _native is None:
        return False
    flags = cpu_capabilities()
    # torch's name for AVX512-BW, then /proc/cpuinfo's
    return bool(flags.get("avx512_bw") or flags.get("avx512bw"))


def activation_max(capabilities: dict[str, bool] | None = None) -> int:
    """The largest uint8 level an activation may take on this CPU (``FULL_RANGE`` where it
    has AMX-INT8 or a VNNI, else ``REDUCED_RANGE``)."""
    flags = cpu_capabilities() if capabilities is None else capabilities
    return FULL_RANGE if any(flags.get(name) for name in _VNNI_FEATURES) else REDUCED_RANGE


def affine_params(low: float, high: float, qmax: int = FULL_RANGE) -> tuple[float, int]:
    """The scale and zero point that map [low, high] (widened to hold 0) onto 0..qmax."""
    low, high = min(low, 0.0), max(high, 0.0)
    scale = (high - low) / qmax if high > low else 1.0
    zero_point = int(min(max(round(-low / scale), 0), qmax))
    return float(scale), zero_point


def value_range(x: torch.Tensor) -> tuple[float, float]:
    """``x``'s (min, max) as floats."""
    if _covered(x):
        low, high = _native.value_range(x.data_ptr(), x.shape[0], x.shape[1], x.stride(0),
                                        x.dtype == torch.bfloat16, torch.get_num_threads())
        return float(low), float(high)
    low, high = torch.aminmax(x)
    return float(low), float(high)


def quantize(x: torch.Tensor, multiplier: torch.Tensor, zero_point: int, qmax: int = FULL_RANGE) -> torch.Tensor:
    """x: [T, n] bf16 or float32, multiplier: float32 [n] contiguous -> uint8 [T, n] in
    0..qmax, contiguous."""
    if _covered(x):
        out = torch.empty(x.shape, dtype=torch.uint8)
        _native.quantize(x.data_ptr(), out.data_ptr(), x.shape[0], x.shape[1], x.stride(0),
                         x.dtype == torch.bfloat16, multiplier.data_ptr(), zero_point, qmax,
                         torch.get_num_threads())
        return out
    return torch.round(x.float() * multiplier).add_(zero_point).clamp_(0, qmax).to(torch.uint8)


def _covered(x: torch.Tensor) -> bool:
    return (kernel_available() and x.device.type == "cpu" and x.dim() == 2 and x.stride(1) == 1
            and x.dtype in (torch.bfloat16, torch.float32))
