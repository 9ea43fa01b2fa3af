"""The fused layers' float32 linear on the AVX2 kernel against torch in float64.

The reference is ``F.linear`` in float64; the bar is a float32 linear's error (torch's
own, what the kernel replaces, or a plain in-order dot product's): the kernel's error
must stay within a small multiple of it, as all sum the same products in another order. Also: which layers take the
kernel, that an engine on it runs steps of up to 64 tokens unpadded (the kernel keeps
no per-count state) and larger ones in their buckets, and that it equals the same
engine on oneDNN.
The kernel's own tests run wherever the CPU has its instructions (``runs_here``);
those of the layers' choice only where layers take it (``kernel``).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from embedserve.engine import Batch, Engine, avx2_linear, profiler_names
from embedserve.engine.onednn import PackedWeight, linears_all_native
from tests.native_build import require_compiler_for
from tests.native_linear_cases import ACTIVATIONS, kernel_calls, linear_layer


@pytest.fixture
def runs_here() -> None:
    if not avx2_linear.kernel_runs_here():
        pytest.skip("the AVX2 linear cannot run here: not built, or no AVX2 and FMA")


@pytest.fixture
def kernel() -> None:
    if not avx2_linear.kernel_available():
        pytest.skip("the AVX2 linear does not run here: not built, or this CPU has AVX-512 (oneDNN keeps every call)")


def sequential_float32(x: torch.Tensor, layer: nn.Linear) -> torch.Tensor:
    """x @ W.T + b as a plain float32 dot product: products and sums in input order, each
    rounded once. Elementwise float32 operations round the same on every CPU, so its
    error does not depend on the host, as torch's own float32 linear's does (oneDNN
    blocks the sums differently per instruction set)."""
    weight = layer.weight.detach()
    total = torch.zeros(x.shape[0], weight.shape[0])
    for j in range(weight.shape[1]):
        total = total + x[:, j:j + 1] * weight[:, j]
    return total if layer.bias is None else total + layer.bias.detach()


def within_torchs_error(out: torch.Tensor, x: torch.Tensor, layer: nn.Linear, activation=lambda t: t) -> None:
    """The kernel's error against float64 is within a small multiple of a float32 linear's:
    torch's here, or a plain in-order dot product's, whichever is larger (the kernel
    sums in order along the input features, which loses more than oneDNN's blocked sums
    on some hosts)."""
    bias = None if layer.bias is None else layer.bias.double()
    expected = activation(F.linear(x.double(), layer.weight.double(), bias))
    torch_error = (activation(F.linear(x, layer.weight, layer.bias)).double() - expected).abs().max()
    in_order_error = (activation(sequential_float32(x, layer)).double() - expected).abs().max()
    error = (out.double() - expected).abs().max()
    assert out.dtype == torch.float32 and out.shape == expected.shape
    assert error <= 4 * max(torch_error, in_order_error) + 1e-6, (error, torch_error, in_order_error)


@pytest.mark.parametrize("rows", [1, 2, 5, 6, 7, 13, 20, 47, 48, 49, 64, 97, 300])
@pytest.mark.parametrize("in_features,out_features", [(384, 1536), (1536, 384), (7, 16), (384, 1152)])
def test_kernel_matches_float64_as_closely_as_torch(runs_here: None, rows: int, in_features: int,
                                                    out_features: int) -> None:
    layer = linear_layer(in_features, out_features)
    x = torch.randn(rows, in_features, generator=torch.Generator().manual_seed(rows))
    out = avx2_linear.linear(x, avx2_linear.pack_panels(layer.weight), layer.bias.detach())
    within_torchs_error(out, x, layer)


def test_rows_of_a_strided_view(runs_here: None) -> None:
    layer = linear_layer(384, 384)
    wide = torch.randn(20, 1152)
    x = wide[:, 384:768]                            # rows 1152 floats apart
    out = avx2_linear.linear(x, avx2_linear.pack_panels(layer.weight), layer.bias.detach())
    within_torchs_error(out, x, layer)


@ACTIVATIONS
def test_kernel_applies_the_activation(runs_here: None, attr: str, algorithm: str, activation) -> None:
    layer = linear_layer(384, 1536)
    x = torch.randn(64, 384, generator=torch.Generator().manual_seed(64))
    out = avx2_linear.linear(x, avx2_linear.pack_panels(layer.weight), layer.bias.detach(), attr, algorithm)
    within_torchs_error(out, x, layer, activation)


@ACTIVATIONS
@pytest.mark.parametrize("bias", [True, False])
def test_packed_weight_runs_on_the_kernel_with_its_activation(kernel: None, attr: str, algorithm: str,
                                                              activation, bias: bool) -> None:
    layer = linear_layer(384, 1536, bias=bias)
    native, onednn = PackedWeight(layer), PackedWeight(layer, native=False)
    assert native.native and not onednn.native
    for rows in (3, 64, 300):
        x = torch.randn(rows, 384, generator=torch.Generator().manual_seed(rows))
        out, calls = kernel_calls(lambda: native(x, attr, algorithm), profiler_names.AVX2_LINEAR)
        assert calls == 1
        within_torchs_error(out, x, layer, activation)
        out, calls = kernel_calls(lambda: onednn(x, attr, algorithm), profiler_names.AVX2_LINEAR)
        assert calls == 0
        within_torchs_error(out, x, layer, activation)


def test_bfloat16_and_odd_widths_stay_on_onednn(kernel: None) -> None:
    assert not avx2_linear.covers(linear_layer(384, 1536).weight.detach().to(torch.bfloat16))
    assert not PackedWeight(linear_layer(384, 40)).native            # not a multiple of 16


def test_an_engine_on_the_kernel_runs_short_steps_unpadded_and_equals_one_on_onednn(
        kernel: None, tiny_bert_dir: Path) -> None:
    short = Batch.from_sequences([np.arange(4, 4 + n, dtype=np.int32) for n in (3, 17, 40)])  # 60 -> 64
    long = Batch.from_sequences([np.arange(4, 4 + n, dtype=np.int32) for n in (3, 70)])       # 73 -> 80
    with (Engine.load(tiny_bert_dir) as native,
          Engine.load(tiny_bert_dir, native_linears=False) as onednn,
          Engine.load(tiny_bert_dir, fused_layers=False) as plain):
        assert linears_all_native(native.model)
        assert not linears_all_native(onednn.model) and not linears_all_native(plain.model)
        ours = native.step(short).wait()
        theirs = onednn.step(short).wait()
        assert native.stats()["padding_waste"] == 0 and onednn.stats()["padding_waste"] == 4 / 64
        assert np.abs(ours - theirs).max() <= 1e-5
        native.step(long).wait()                   # above 64 tokens the buckets stay
        assert native.stats()["padding_waste"] == (80 - 73) / (60 + 80)


def test_the_kernel_is_built_where_the_compiler_can_target_avx2(tmp_path: Path) -> None:
    require_compiler_for(tmp_path, ["-mavx2", "-mfma"],
                         "#include <immintrin.h>\n__m256 f(__m256 a, __m256 b, __m256 c) "
                         "{ return _mm256_fmadd_ps(a, b, c); }\n")
    assert avx2_linear._native is not None, "embedserve.engine._avx2_linear was not built"
