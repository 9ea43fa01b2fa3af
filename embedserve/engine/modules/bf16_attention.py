"""bf16 bidirectional attention per sequence, natively, for the CPU path.

Owns deciding whether the native kernel (``engine/csrc/bf16_attention.c``,
built at install where the compiler can target AMX and AVX512-BF16) may run a
call, which of its two instruction paths runs, and calling it on the data
pointers of a packed batch. ``per_sequence`` attention (attention.py) uses it
for the calls it covers and torch's SDPA for the rest: other dtypes, head
sizes other than 32 and 64, causal or windowed attention, CPUs without
AVX512-BF16, and installs where the kernel was not built.

Why: in bf16 the SDPA flash kernel spends most of its time on the softmax at
these head sizes (BENCHMARKS.md, engine section); the kernel's products run on
AMX tiles where the CPU has them (Intel since Sapphire Rapids), else on
AVX512-BF16's VDPBF16PS (AMD Zen 4 and later, Intel Cooper Lake), and its
exponentials in one AVX-512 pass. For --dtype int8's layers (``quantized``) its
products run in int8 on VPDPBUSD where the CPU has AVX512-VNNI and the kernel runs
VDPBF16PS (``int8_products_available``; csrc/attention_int8.h).
"""

from __future__ import annotations

import functools
import logging

import torch

from embedserve.engine import profiler_names
from embedserve.engine.dtype_choice import cpu_capabilities

try:
    from embedserve.engine import _bf16_attention as _native  # type: ignore[attr-defined]  # C extension
except ImportError:          # not built: no compiler, or one that cannot target AMX / AVX512-BF16
    _native = None

HEAD_SIZES = (32, 64)
LARGEST_ROW_STRIDE = 1 << 26     # elements; the kernel gathers rows by 32-bit byte offsets
AMX = "amx"
AVX512_BF16 = "avx512_bf16"

log = logging.getLogger(__name__)


@functools.cache
def available_paths() -> tuple[str, ...]:
    """The kernel's instruction paths this process can run, fastest first (empty: none)."""
    if _native is None or not torch.cpu._is_avx512_bf16_supported():
        return ()
    if not torch.cpu._is_amx_tile_supported():
        return (AVX512_BF16,)
    if not _native.request_tiles():
        log.warning("AMX attention off: Linux refused this process the AMX tile state")
        return (AVX512_BF16,)
    return (AMX, AVX512_BF16)


def kernel_path() -> str | None:
    """The path calls take: AMX tiles where granted, else VDPBF16PS; None where neither runs."""
    paths = available_paths()
    return paths[0] if paths else None


def kernel_available() -> bool:
    """Whether the kernel is built and this CPU can run one of its paths."""
    return kernel_path() is not None


def quantize_min_length() -> int:
    """The shortest sequence a ``quantized`` call multiplies in int8 (shorter ones: bf16)."""
    return int(_native.QUANTIZE_MIN_LENGTH) if _native is not None else 0


@functools.cache
def int8_products_available() -> bool:
    """Whether calls may take ``quantized=True`` here: the kernel runs on VDPBF16PS (not on
    AMX tiles, where its bf16 products were not measured against int8 ones) and the CPU
    has AVX512-VNNI (VPDPBUSD)."""
    return kernel_path() == AVX512_BF16 and bool(cpu_capabilities().get("avx512_vnni"))


def covers(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> bool:
    """Whether the kernel can run bidirectional attention on these bf16 CPU rows.

    q, k, v: [T, heads, head_dim], each with heads contiguous in its rows (slices
    of the fused QKV projection are; rows may be any distance apart).
    """
    if q.shape[2] not in HEAD_SIZES or any(t.shape != q.shape for t in (k, v)):
        return False
    for t in (q, k, v):
        if t.dtype != torch.bfloat16 or t.device.type != "cpu" or t.stride()[1:] != (q.shape[2], 1):
            return False
        if not 0 < t.stride(0) <= LARGEST_ROW_STRIDE:
            return False
    return kernel_available()


def attend_sequences(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, starts: torch.Tensor,
                     lengths: torch.Tensor, path: str | None = None,
                     bias: torch.Tensor | None = None, quantized: bool = False) -> torch.Tensor:
    """Attention of each sequence to itself: q, k, v [T, heads, head_dim] -> [T, heads, head_dim].

    starts, lengths: int64 [B], contiguous; sequence b is rows starts[b] .. starts[b] + lengths[b].
    ``path``: one of ``available_paths()`` (default: the fastest). ``bias``: float32
    [heads, 2 * reach + 1], contiguous, added to each scaled score by its distance (key
    index - query index, at column distance + reach; ``relative_bias_rows``), reach at
    least the longest sequence - 1; finite (-1e30 masks a key out; -inf gives NaN).
    ``quantized``: the products in int8 (csrc/attention_int8.h; ``int8_products_available``,
    no bias) for sequences of ``quantize_min_length()`` tokens or more, for --dtype int8's
    layers. The caller checks ``covers`` first. Runs on torch's
    intra-op thread count.
    """
    if quantized:
        if not int8_products_available():
            raise RuntimeError("the attention kernel's int8 products need AVX512-VNNI and its VDPBF16PS path")
        if bias is not None:
            raise ValueError("the attention kernel's int8 products take no bias")
        path = AVX512_BF16
    path = path or kernel_path()
    if path not in available_paths():
        # An AMX instruction without the tile state granted kills the process (SIGILL).
        raise RuntimeError(f"the bf16 attention kernel cannot run {path or 'any path'} here")
    tokens, heads, head_dim = q.shape
    out = torch.empty((tokens, heads, head_dim), dtype=torch.bfloat16)
    if not tokens:
        return out
    bias_at, reach = 0, 0
    if bias is not None:
        if bias.dtype != torch.float32 or not bias.is_contiguous() or bias.shape[0] != heads or bias.shape[1] % 2 != 1:
            raise ValueError(f"bias must be contiguous float32 [heads, 2 * reach + 1], got {tuple(bias.shape)} "
                             f"{bias.dtype}")
        bias_at, reach = bias.data_ptr(), bias.shape[1] // 2
    with profiler_names.named(profiler_names.BF16_ATTENTION):
        _native.attend(q.data_ptr(), k.data_ptr(), v.data_ptr(), out.data_ptr(),
                       q.stride(0), k.stride(0), v.stride(0), out.stride(0), heads, head_dim,
                       starts.data_ptr(), lengths.data_ptr(), starts.shape[0], head_dim ** -0.5,
                       torch.get_num_threads(), path == AMX, bias_at, reach, quantized)
    return out
