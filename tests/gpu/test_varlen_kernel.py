"""PyTorch's varlen kernel as the engine calls it, against the float64 reference.

What the CPU tests cannot check: the real kernel's numbers at the dtypes and head
sizes the engine serves, every attention kind, zero-length rows and a bucket's dump
row, grouped heads, and the same call captured in a CUDA graph and replayed after its
lengths change in place (a bucket's graph serves every length mix that fits it).
"""

from __future__ import annotations

import pytest
import torch

from embedserve.engine.modules import varlen_attention
from embedserve.engine.modules.attention import AttentionKind

from .reference import varlen_reference

# bf16 keeps 8 mantissa bits, fp16 11: the output's rounding alone is 2^-9 / 2^-12 of
# its magnitude (|out| <= max |v| = ~4 for these inputs), and the kernel accumulates in
# float32.
TOLERANCE = {torch.bfloat16: 3e-2, torch.float16: 4e-3}
KINDS = [AttentionKind(), AttentionKind(causal=True), AttentionKind(window=7),
         AttentionKind(causal=True, window=7)]
# A bucket's lengths row: real rows, empty padding rows, then the dump row of padding tokens.
LENGTHS = [37, 1, 128, 0, 5, 0, 0, 21]


def _kernel_or_skip() -> varlen_attention.VarlenKernel:
    kernel = varlen_attention.torch_kernel()
    if kernel is None:
        pytest.skip(f"torch {torch.__version__} has no torch.nn.attention.varlen")
    return kernel


def _inputs(lengths: list[int], heads: int, kv_heads: int, head_dim: int, dtype: torch.dtype,
            seed: int = 0) -> tuple[torch.Tensor, ...]:
    generator = torch.Generator(device="cuda").manual_seed(seed)
    total = sum(lengths)
    return tuple(torch.randn(total, h, head_dim, device="cuda", dtype=dtype, generator=generator)
                 for h in (heads, kv_heads, kv_heads))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("head_dim", [32, 64, 128])
@pytest.mark.parametrize("kind", KINDS, ids=str)
def test_the_kernel_matches_the_reference(dtype: torch.dtype, head_dim: int, kind: AttentionKind,
                                          measured: dict) -> None:
    kernel = _kernel_or_skip()
    if kind.window is not None and not varlen_attention.takes(kernel, "window_size"):
        pytest.skip("this PyTorch's varlen_attn has no window_size")
    lengths = torch.tensor(LENGTHS, device="cuda")
    q, k, v = _inputs(LENGTHS, 4, 4, head_dim, dtype)
    attend = varlen_attention.varlen_from_lengths(lengths, max(LENGTHS), kind.causal, kind.window)
    got = attend(q, k, v)
    expected = varlen_reference(q, k, v, varlen_attention.cu_seqlens_from_lengths(lengths),
                                varlen_attention.window_size(kind))
    error = (got.double().cpu() - expected).abs().max().item()
    measured[f"varlen {dtype} d{head_dim} {kind}"] = error
    assert error <= TOLERANCE[dtype]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_grouped_heads_match_the_reference(dtype: torch.dtype, measured: dict) -> None:
    kernel = _kernel_or_skip()
    if not varlen_attention.takes(kernel, "enable_gqa"):
        pytest.skip("this PyTorch's varlen_attn has no enable_gqa")
    lengths = torch.tensor(LENGTHS, device="cuda")
    q, k, v = _inputs(LENGTHS, 16, 8, 128, dtype)        # Qwen3-Embedding-0.6B's heads
    attend = varlen_attention.varlen_from_lengths(lengths, max(LENGTHS), causal=True)
    assert attend.grouped_heads
    got = attend(q, k, v)
    expected = varlen_reference(q, k, v, varlen_attention.cu_seqlens_from_lengths(lengths), (-1, 0))
    error = (got.double().cpu() - expected).abs().max().item()
    measured[f"varlen gqa {dtype}"] = error
    assert error <= TOLERANCE[dtype]


def test_a_captured_call_replays_for_new_lengths_in_place() -> None:
    """One graph per bucket: the lengths row is the graph's input, so new lengths copied
    into it must give what an eager call with those lengths gives."""
    _kernel_or_skip()
    first, second = [60, 4, 0, 0], [1, 2, 41, 20]          # same total, same row count
    lengths = torch.tensor(first, device="cuda")
    q, k, v = _inputs(first, 4, 4, 64, torch.bfloat16, seed=1)
    # cu_seqlens is derived from the lengths row inside the captured work, as in a bucket.
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        varlen_attention.varlen_from_lengths(lengths, 64)(q, k, v)   # warm-up outside the capture
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = varlen_attention.varlen_from_lengths(lengths, 64)(q, k, v)
    for new in (second, first):
        lengths.copy_(torch.tensor(new, device="cuda"))
        graph.replay()
        eager = varlen_attention.varlen_from_lengths(torch.tensor(new, device="cuda"), 64)(q, k, v)
        torch.testing.assert_close(captured, eager, atol=0, rtol=0)
