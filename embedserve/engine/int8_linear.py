"""The int8 linears (int8_layers.py) for calls of few rows: one native call, AVX512-VNNI or AMX-INT8.

Owns deciding whether a call goes to the kernel (``engine/csrc/int8_linear.c``, built at
install where the compiler targets AVX512-VNNI, AVX512-BF16 and AMX) and the weight's copy in
the kernel's panel layout. Why: oneDNN's quantized matmul and the quantization pass before
it cost tens of microseconds a call each whatever the size, so a short query's step with
int8 linears took ~2.5x a bf16 one although the weights are half the bytes. The kernel
quantizes its bf16 input to the same uint8 bytes (static or dynamic, as the layer does),
multiplies with VPDPBUSD, or TDPBUSD on AMX-INT8 tiles where the CPU has them (oneDNN's
integer products either way), and writes bf16 with the bias and activation applied
(``python -m bench int8_few_rows``: where oneDNN takes over). A linear whose input is
quantized per row (int8_layers.PER_ROW_LINEARS), which oneDNN cannot take, has every
call here whatever its size.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch

from embedserve.engine import profiler_names
from embedserve.engine.bf16_linear import ACTIVATIONS, HELPER_TEAM
from embedserve.engine.dtype_choice import cpu_capabilities
from embedserve.engine.modules import bf16_attention

try:
    from embedserve.engine import _int8_linear as _native  # type: ignore[attr-defined]  # C extension
except ImportError:          # not built: no compiler, or one that cannot target AVX512-VNNI
    _native = None

PANEL = 32                   # output columns per panel (two 16-int32 accumulators)
# The native call's ``quantization`` codes (csrc/int8_linear.c).
QUANTIZE_STATIC, QUANTIZE_DYNAMIC, QUANTIZE_PER_ROW = 0, 1, 2
# Calls of up to this many rows take the kernel; more go to oneDNN, whose AMX-INT8 /
# VNNI matmul is as fast or faster once its per-call cost is spread over enough rows.
# Measured on the default model's three int8 linears (2 threads): on tiles (Xeon with
# AMX) 1.2-1.9x oneDNN at 128 rows, 0.8-1.3x at 512, 0.8-1.4x at 4,096; with VNNI (Zen 5,
# oneDNN on VNNI too) 1.47x at 64 rows, 1.30x at 128, 1.16x at 256, 1.06-1.24x at 384-512,
# 1.03-1.04x at 768-1,024 (docs/engine.md).
MAX_ROWS_TILES = 128
MAX_ROWS_VNNI = 512
# A model's int8 linears get the kernel's copy while they are at most this many bytes:
# the copy costs as much memory again as oneDNN's (multilingual-e5-small's three int8
# linears a layer: 14 MB; Qwen3-Embedding-0.6B's: ~350 MB). As amx_linear.MAX_WEIGHT_BYTES.
MAX_WEIGHT_BYTES = 256 << 20


@functools.cache
def kernel_available() -> bool:
    """Whether the kernel is built and this CPU has AVX512-VNNI and AVX512-BF16 (its bf16 output)."""
    flags = cpu_capabilities()
    return _native is not None and bool(flags.get("avx512_vnni")) and bool(flags.get("avx512_bf16"))


@functools.cache
def tiles_available() -> bool:
    """Whether calls may run on AMX-INT8 tiles: the kernel runs here, the CPU has AMX-INT8
    and Linux granted this process the tile state (bf16_attention asks at import)."""
    return (kernel_available() and bool(cpu_capabilities().get("amx_int8"))
            and bf16_attention.kernel_path() == bf16_attention.AMX)


def helper_available() -> bool:
    """Whether calls may run on this thread and bf16_linear's helper thread (``HELPER_TEAM``,
    a replica's short steps): the kernel runs here on VPDPBUSD (tiles are configured per
    thread) and borrowed bf16_linear's team at import."""
    return kernel_available() and bool(getattr(_native, "shares_helper", 0)) and not tiles_available()


def max_rows() -> int:
    """The most rows a call may have to take the kernel here."""
    return MAX_ROWS_TILES if tiles_available() else MAX_ROWS_VNNI


def copy_fits(weight_elements: int) -> bool:
    """Whether a model whose int8 linears hold ``weight_elements`` weights gets the kernel's
    copy of them (``MAX_WEIGHT_BYTES``)."""
    return kernel_available() and weight_elements <= MAX_WEIGHT_BYTES


def covers(quantized: torch.Tensor) -> bool:
    """Whether the int8 weight ``quantized`` ([out, in]) can take the kernel (``covers_shape``)."""
    return quantized.dtype == torch.int8 and quantized.dim() == 2 and covers_shape(*quantized.shape)


def covers_shape(out_features: int, in_features: int) -> bool:
    """Whether a weight [out, in] can take the kernel: ``out`` a multiple of 32, ``in`` of 4,
    and the kernel available."""
    return kernel_available() and out_features % PANEL == 0 and in_features % 4 == 0


def pack_panels(quantized: torch.Tensor) -> torch.Tensor:
    """int8 ``quantized`` [out, in] as the kernel reads it: [out / 32, in / 4, 32, 4], contiguous."""
    out_features, in_features = quantized.shape
    return (quantized.reshape(out_features // PANEL, PANEL, in_features // 4, 4)
            .permute(0, 2, 1, 3).contiguous())


def column_sums(quantized: torch.Tensor) -> torch.Tensor:
    """Each output's sum of its int8 weights, int32 [out]: what the input's zero point
    takes away from the products."""
    return quantized.to(torch.int32).sum(dim=1, dtype=torch.int32).contiguous()


def quantization(multiplier: torch.Tensor | None, per_row: bool) -> int:
    """The native call's code for how its input becomes uint8: static (``multiplier`` given),
    dynamic over the call, or dynamic per row."""
    if multiplier is not None:
        return QUANTIZE_STATIC
    return QUANTIZE_PER_ROW if per_row else QUANTIZE_DYNAMIC


def linear(x: torch.Tensor, panels: torch.Tensor, sums: torch.Tensor, w_scales: torch.Tensor, bias: torch.Tensor,
           multiplier: torch.Tensor | None, x_scale: float, zero_point: int, qmax: int, per_row: bool = False,
           attr: str = "none", algorithm: str = "") -> torch.Tensor:
    """bf16 ``activation(x @ W.T + bias)`` for x [rows, in] bf16 on the int8 weight
    (``panels`` from pack_panels, ``sums`` from column_sums, ``w_scales`` float32 [out]).
    ``multiplier`` (float32 [in]), ``x_scale`` and ``zero_point``: the input's static
    quantization; None: dynamic (measured on ``x``, as int8_quantize.affine_params), over
    the whole input or, with ``per_row``, over each row apart."""
    if x.stride(1) != 1:
        x = x.contiguous()
    rows, in_features = x.shape
    out_features = panels.shape[0] * PANEL
    y = torch.empty(rows, out_features, dtype=torch.bfloat16)
    with profiler_names.named(profiler_names.INT8_LINEAR):
        _native.linear(x.data_ptr(), 0 if multiplier is None else multiplier.data_ptr(), x_scale, zero_point, qmax,
                       quantization(multiplier, per_row), panels.data_ptr(), sums.data_ptr(), w_scales.data_ptr(),
                       bias.data_ptr(), y.data_ptr(), rows, out_features, in_features, x.stride(0),
                       torch.get_num_threads(), ACTIVATIONS[attr, algorithm], tiles_available())
    return y


def pointer_call(panels: torch.Tensor, sums: torch.Tensor, w_scales: torch.Tensor, bias: torch.Tensor,
                 multiplier: torch.Tensor | None, x_scale: float, zero_point: int, qmax: int, per_row: bool,
                 activation: int, helper: bool = False) -> Callable[[int, int, int, int], None]:
    """``linear``'s call on data pointers, ``call(x, y, rows, threads)`` (x [rows, in] bf16
    and y [rows, out] bf16, contiguous; ``activation``: the kernel's code), for loops that
    keep their activations in buffers of their own (small_steps.py). ``helper``: on this
    thread and bf16_linear's helper thread where ``helper_available``, whatever ``threads``.
    The tensors must outlive the call."""
    out_features, in_features = panels.shape[0] * PANEL, panels.shape[1] * 4
    native = _native.linear
    multiplier_at = 0 if multiplier is None else multiplier.data_ptr()
    mode = quantization(multiplier, per_row)
    panels_at, sums_at, scales_at, bias_at = panels.data_ptr(), sums.data_ptr(), w_scales.data_ptr(), bias.data_ptr()
    tiles = tiles_available()
    helped = helper and helper_available()

    def call(x: int, y: int, rows: int, threads: int) -> None:
        native(x, multiplier_at, x_scale, zero_point, qmax, mode, panels_at, sums_at, scales_at, bias_at, y,
               rows, out_features, in_features, in_features, HELPER_TEAM if helped else threads, activation, tiles)
    return call
