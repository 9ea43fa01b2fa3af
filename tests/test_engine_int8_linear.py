"""``--dtype int8``'s few-row linears on the AVX512-VNNI kernel (engine/int8_linear.py).

References: oneDNN's quantized matmul (``torch.ops.onednn.qlinear_pointwise``, what the
layer runs without the kernel) on the same weights and input, and the quantized
arithmetic in float64 by torch (``(x_q - zero_point) @ w_q.T * scales + bias``, then the
activation). The integer products are exact in both, so the kernel may differ from
oneDNN only where a float32 epilogue lands on the other side of a bf16 rounding. Also:
which calls take the kernel, that an engine's short steps do, and the refusals of the
native call.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from embedserve.engine import Batch, int8_linear, profiler_names
from embedserve.engine.int8_layers import Int8Weight
from tests.native_build import require_compiler_for
from tests.native_linear_cases import ACTIVATIONS, bf16_rows, helper_threads, kernel_calls, mismatches_at_once


@pytest.fixture
def kernel() -> None:
    if not int8_linear.kernel_available():
        pytest.skip("the int8 few-row kernel does not run here: not built, or no AVX512-VNNI / AVX512-BF16")


@pytest.fixture(params=["vnni", "tiles"])
def products(request: pytest.FixtureRequest, kernel: None, monkeypatch: pytest.MonkeyPatch) -> str:
    """The kernel's two ways to the integer products: VPDPBUSD, or AMX-INT8 tiles (where
    the CPU has them; the VNNI way is what a CPU without AMX runs, made to run here)."""
    if request.param == "tiles" and not int8_linear.tiles_available():
        pytest.skip("no AMX-INT8 tiles here")
    if request.param == "vnni":
        monkeypatch.setattr(int8_linear, "tiles_available", lambda: False)
    return request.param


def int8_weight(in_features: int, out_features: int, x: torch.Tensor, static: bool) -> Int8Weight:
    torch.manual_seed(0)
    linear = nn.Linear(in_features, out_features)
    observed = (x.float().amin(0) - 0.05, x.float().amax(0) + 0.05) if static else None
    return Int8Weight(linear, observed, smooth=static)


def onednn(weight: Int8Weight, x: torch.Tensor, attr: str, algorithm: str) -> torch.Tensor:
    weight.few_rows = False
    try:
        out, calls = kernel_calls(lambda: weight(x, torch.bfloat16, attr, algorithm), profiler_names.INT8_LINEAR)
    finally:
        weight.few_rows = True
    assert calls == 0
    return out


def float64_reference(weight: Int8Weight, x: torch.Tensor, activation) -> torch.Tensor:
    """The layer's quantized arithmetic in float64: its input's uint8 levels as the
    definition computes them (the float32 product x * multiplier, rounded half to even,
    as oneDNN's quantizer), minus the zero point, times the int8 weight, scaled."""
    quantized = weight.few_rows_panels.permute(0, 2, 1, 3).reshape(weight.scales.shape[0], -1).double()
    if weight.static:
        multiplier, scale, zero_point = weight.multiplier, weight.input_scale, weight.input_zero_point
    else:
        low, high = min(float(x.min()), 0.0), max(float(x.max()), 0.0)
        scale = (high - low) / weight.qmax
        zero_point = round(-low / scale)
        multiplier = torch.full((x.shape[1],), 1.0 / scale, dtype=torch.float32)
    levels = torch.round(x.float() * multiplier).double().add_(zero_point).clamp_(0, weight.qmax)
    sums = (levels - zero_point) @ quantized.T
    return activation(sums * (scale * weight.scales.double()) + weight.bias.double())


@pytest.mark.parametrize("static", [True, False], ids=["static", "dynamic"])
@pytest.mark.parametrize("rows", [1, 2, 11, 12, 13, 17, 64, 128, 300])
@pytest.mark.parametrize("in_features,out_features", [(384, 1152), (1536, 384), (36, 96), (64, 96)])
def test_kernel_matches_onednn_and_float64(products: str, static: bool, rows: int, in_features: int,
                                           out_features: int) -> None:
    if rows > int8_linear.max_rows():
        pytest.skip(f"over {int8_linear.max_rows()} rows oneDNN runs the call")
    x = bf16_rows(rows, in_features).mul_(3)
    weight = int8_weight(in_features, out_features, x, static)
    assert weight.few_rows
    ours, calls = kernel_calls(lambda: weight(x, torch.bfloat16), profiler_names.INT8_LINEAR)
    assert calls == 1
    theirs = onednn(weight, x, "none", "")
    expected = float64_reference(weight, x, lambda t: t)
    assert ours.dtype == torch.bfloat16 and ours.shape == (rows, out_features)
    # one bf16 rounding (half a step: at most 2^-8 relative) of a float32 epilogue
    step = expected.abs() * 2.0 ** -8 + 1e-4
    assert ((ours.double() - expected).abs() <= step).all()
    # two such roundings: where they part, one bf16 step (at most 2^-7 relative)
    assert ((ours.double() - theirs.double()).abs() <= 2 * step).all()
    assert (ours != theirs).float().mean() <= 0.01


@ACTIVATIONS
def test_kernel_applies_the_activation(products: str, attr: str, algorithm: str, activation) -> None:
    x = bf16_rows(9, 384).mul_(3)
    weight = int8_weight(384, 1536, x, static=True)
    ours = weight(x, torch.bfloat16, attr, algorithm)
    expected = float64_reference(weight, x, activation)
    theirs = onednn(weight, x, attr, algorithm)
    close = (ours.double() - expected).abs() <= expected.abs() * 2.0 ** -8 + 1e-4
    assert close.all(), (ours.double() - expected).abs().max()
    assert (ours != theirs).float().mean() <= 0.01


def test_rows_of_a_strided_view(products: str) -> None:
    wide = bf16_rows(20, 1152).mul_(3)
    x = wide[:, 384:768]                             # rows 1152 elements apart
    weight = int8_weight(384, 384, x.contiguous(), static=False)
    assert torch.equal(weight(x, torch.bfloat16), weight(x.contiguous(), torch.bfloat16))
    ours, theirs = weight(x, torch.bfloat16), onednn(weight, x.contiguous(), "none", "")
    assert (ours != theirs).float().mean() <= 0.01


def test_which_calls_take_the_kernel(kernel: None) -> None:
    x = bf16_rows(int8_linear.max_rows() + 1, 384)
    weight = int8_weight(384, 384, x, static=True)
    _, calls = kernel_calls(lambda: weight(x, torch.bfloat16), profiler_names.INT8_LINEAR)
    assert calls == 0                                # over max_rows(): oneDNN's
    _, calls = kernel_calls(lambda: weight(x.float()[:4], torch.float32), profiler_names.INT8_LINEAR)
    assert calls == 0                                # a float32 base: oneDNN's
    assert not int8_linear.covers(torch.zeros(48, 384, dtype=torch.int8))    # not a multiple of 32 outputs
    assert not int8_linear.covers(torch.zeros(64, 38, dtype=torch.int8))     # nor of 4 inputs
    assert not Int8Weight(nn.Linear(38, 64), None).few_rows


@pytest.mark.parametrize("rows", [1, 6, 13, 64, 97])
@pytest.mark.parametrize("static", [True, False], ids=["static", "dynamic"])
def test_calls_with_the_helper_thread_give_one_threads_bits(products: str, rows: int, static: bool) -> None:
    """``helper=True`` (a replica's short steps) splits a call's panels between this thread
    and bf16_linear's helper thread, the only helper the process has: every output the
    same bits as one thread's. On tiles (configured per thread) calls stay on this thread."""
    if products == "vnni" and not int8_linear.helper_available():
        pytest.skip("bf16_linear's helper team is not built here")

    x = bf16_rows(rows, 384).mul_(3)
    weight = int8_weight(384, 1152, x, static)
    alone, helped = torch.empty(rows, 1152, dtype=torch.bfloat16), torch.empty(rows, 1152, dtype=torch.bfloat16)
    weight.few_rows_call(0)(x.data_ptr(), alone.data_ptr(), rows, 1)
    assert torch.equal(alone, weight(x, torch.bfloat16))
    for _ in range(3):
        helped.fill_(0)
        weight.few_rows_call(0, helper=True)(x.data_ptr(), helped.data_ptr(), rows, 1)
        assert torch.equal(helped, alone)
    if products == "vnni":
        assert helper_threads() == 1                 # started by these calls, or earlier by bf16_linear's


@pytest.mark.parametrize("rows", [1, 13, 97, 600, 6000])
def test_per_row_quantization_takes_each_rows_own_range(products: str, rows: int) -> None:
    """Per row (the second feed-forward linear, int8_layers.PER_ROW_LINEARS): each output
    row the same bits as that row's own call with one range (dynamic mode), so within a
    bf16 rounding of oneDNN's dynamic matmul on the row alone and of float64; at any number
    of rows (oneDNN cannot take per-row scales, so none goes to it). 6,000 rows of 1,536
    (9 MB quantized) take the path that quantizes each chunk of rows before its products."""
    torch.manual_seed(1)
    linear = nn.Linear(1536, 384)
    spread = torch.linspace(0.05, 4.0, rows)[:, None]             # rows of very different ranges
    x = (bf16_rows(rows, 1536).float() * spread).to(torch.bfloat16)
    per_row, one_range = Int8Weight(linear, None, per_row=True), Int8Weight(linear, None)
    assert per_row.per_row and per_row.few_rows and not hasattr(per_row, "weight")
    ours, calls = kernel_calls(lambda: per_row(x, torch.bfloat16), profiler_names.INT8_LINEAR)
    assert calls == 1 and ours.shape == (rows, 384)
    for i in range(rows):
        assert torch.equal(ours[i:i + 1], one_range(x[i:i + 1], torch.bfloat16)), i
    for i in sorted({0, rows // 2, rows - 1}):
        row = x[i:i + 1]
        expected = float64_reference(one_range, row, lambda t: t)
        step = expected.abs() * 2.0 ** -8 + 1e-4
        assert ((ours[i:i + 1].double() - expected).abs() <= step).all()
        assert ((ours[i:i + 1].double() - onednn(one_range, row, "none", "").double()).abs() <= 2 * step).all()
    if rows > 1:                                                   # one range for all rows parts from it
        assert not torch.equal(ours, one_range(x, torch.bfloat16) if rows <= int8_linear.max_rows()
                               else int8_linear.linear(x, *one_range._kernel_operands()))


def test_int8_and_bf16_calls_from_several_threads_share_one_helper(products: str) -> None:
    """int8_linear borrows bf16_linear's team: calls of both kernels from several threads at
    once, each with the helper where it is free and alone where another call holds it,
    every one with its own rows' bits, none hung."""
    if products != "vnni" or not int8_linear.helper_available():
        pytest.skip("int8 calls take the helper only on VPDPBUSD with bf16_linear built")
    from embedserve.engine import bf16_linear
    from tests.test_engine_bf16_linear import native_call

    int8_inputs = [bf16_rows(rows, 384).mul_(3) for rows in (6, 20)]
    weights = [int8_weight(384, 1152, x, static) for x, static in zip(int8_inputs, (True, False), strict=True)]
    bf16_inputs = [bf16_rows(rows, 384) for rows in (7, 32)]
    linear = nn.Linear(384, 1536)
    panels = bf16_linear.pack_panels(linear.weight.detach().to(torch.bfloat16))
    bias = linear.bias.detach().float()

    def int8_call(i: int, helper: bool) -> torch.Tensor:
        y = torch.full((int8_inputs[i].shape[0], 1152), float("nan"), dtype=torch.bfloat16)
        weights[i].few_rows_call(0, helper)(int8_inputs[i].data_ptr(), y.data_ptr(), y.shape[0], 1)
        return y

    calls = [lambda i=i, helper=True: int8_call(i, helper) for i in range(2)]
    calls += [lambda i=i, helper=True: native_call(bf16_inputs[i], panels, bias,
                                                    bf16_linear.HELPER_TEAM if helper else 1) for i in range(2)]
    expected = [call(helper=False) for call in calls]
    assert mismatches_at_once(calls, expected, 200) == []
    assert helper_threads() == 1


def test_the_native_call_refuses_what_it_cannot_take(kernel: None) -> None:
    x, y = torch.zeros(2, 64, dtype=torch.bfloat16), torch.empty(2, 64, dtype=torch.bfloat16)
    panels, sums = torch.zeros(2, 16, 32, 4, dtype=torch.int8), torch.zeros(64, dtype=torch.int32)
    scales, bias = torch.ones(64), torch.zeros(64)

    def call(k: int = 64, zero_point: int = 0, activation: int = 0, quantization: int = 1) -> None:
        int8_linear._native.linear(x.data_ptr(), 0, 1.0, zero_point, 255, quantization, panels.data_ptr(),
                                   sums.data_ptr(), scales.data_ptr(), bias.data_ptr(), y.data_ptr(), 2, 64, k, 64, 1,
                                   activation, False)

    with pytest.raises(ValueError, match="k a positive multiple of 4.*k 62"):
        call(k=62)
    with pytest.raises(ValueError, match="zero_point <= qmax"):
        call(zero_point=256)
    with pytest.raises(ValueError, match="activation must be 0 to 3, got 4"):
        call(activation=4)
    with pytest.raises(ValueError, match="quantization must be 0 to 2, got 3"):
        call(quantization=3)
    call()
    assert torch.equal(y, torch.zeros_like(y))


def test_an_int8_engines_short_steps_run_on_the_kernel_unpadded(kernel: None, tiny_bert_dir: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """Steps of up to 64 tokens: every int8 linear on the kernel, and (no linear keeping a
    oneDNN primitive per row count) not padded to a token bucket; without the kernel they
    are, as oneDNN needs."""
    from embedserve.engine import Engine
    from embedserve.engine.small_steps import SmallStepForward

    short = Batch.from_sequences([np.arange(4, 4 + n, dtype=np.int32) for n in (3, 17, 40)])   # 60 -> 64
    with Engine.load(tiny_bert_dir, dtype="int8") as engine, Engine.load(tiny_bert_dir, dtype="float32") as exact:
        ours, calls = kernel_calls(lambda: engine.step(short, inline=True).wait(), profiler_names.INT8_LINEAR)
        layers = len(engine.model.encoder.layers)
        per_row = isinstance(engine.model.encoder.layers[0].ffn_out, Int8Weight)
        assert per_row == (not int8_linear.tiles_available())
        # QKV, attention output, first feed-forward; and the second, per row, on VPDPBUSD
        assert calls == (4 if per_row else 3) * layers
        assert engine.stats()["padding_waste"] == 0
        if isinstance(engine._runner._small, SmallStepForward):
            assert engine._runner._small._pointers is not None
        reference = exact.step(short).wait()
        cosine = (ours * reference).sum(1) / np.linalg.norm(ours, axis=1) / np.linalg.norm(reference, axis=1)
        assert cosine.min() >= 0.99 and np.abs(ours - reference).max() > 1e-3
    monkeypatch.setattr(int8_linear, "kernel_available", lambda: False)
    with Engine.load(tiny_bert_dir, dtype="int8") as onednn:
        theirs, calls = kernel_calls(lambda: onednn.step(short, inline=True).wait(), profiler_names.INT8_LINEAR)
        assert calls == 0 and onednn.stats()["padding_waste"] == 4 / 64
    # not the same bits: dynamic activations take their range over the padding's rows too
    assert ((ours * theirs).sum(1) / np.linalg.norm(ours, axis=1) / np.linalg.norm(theirs, axis=1)).min() >= 0.999


def test_a_model_over_the_copy_budget_keeps_onednns_weights_only(kernel: None, tiny_bert_dir: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """The kernel's copy costs as much memory again as oneDNN's: a model whose int8 linears
    are over ``MAX_WEIGHT_BYTES`` keeps one copy, and every call runs on oneDNN. The
    per-row linears (the kernel's copy their only one) are not counted."""
    from embedserve.engine import Engine

    monkeypatch.setattr(int8_linear, "MAX_WEIGHT_BYTES", 1000)
    short = Batch.from_sequences([np.arange(4, 24, dtype=np.int32)])
    with Engine.load(tiny_bert_dir, dtype="int8") as engine:
        weights = [module for module in engine.model.modules() if isinstance(module, Int8Weight)]
        one_scale = [weight for weight in weights if not weight.per_row]
        assert one_scale and not any(weight.few_rows or hasattr(weight, "few_rows_panels") for weight in one_scale)
        assert all(weight.few_rows and not hasattr(weight, "weight") for weight in weights if weight.per_row)
        _, calls = kernel_calls(lambda: engine.step(short, inline=True).wait(), profiler_names.INT8_LINEAR)
        assert calls == len(weights) - len(one_scale)


def test_the_kernel_is_built_where_the_compiler_can_target_avx512_vnni_and_amx(tmp_path: Path) -> None:
    require_compiler_for(tmp_path, ["-mavx512f", "-mavx512vnni", "-mavx512bf16", "-mamx-tile", "-mamx-int8"],
                         "#include <immintrin.h>\n__m512i f(__m512i a, __m512i b, __m512i c) "
                         "{ _tile_dpbusd(0, 1, 2); return _mm512_dpbusd_epi32(a, b, c); }\n")
    assert int8_linear._native is not None, "embedserve.engine._int8_linear was not built"


def test_float64_reference_is_not_the_kernel_itself(kernel: None) -> None:
    """The reference's arithmetic is independent: on a layer with one nonzero weight it
    gives the hand-computed value."""
    linear = nn.Linear(4, 32)
    with torch.no_grad():
        linear.weight.zero_()
        linear.weight[0, 1] = 0.5
        linear.bias.zero_()
    weight = Int8Weight(linear, None)
    x = torch.tensor([[0.0, 2.0, -1.0, 1.0]], dtype=torch.bfloat16)
    expected = float64_reference(weight, x, lambda t: t)
    assert abs(float(expected[0, 0]) - 1.0) < 0.02 and float(expected[0, 1:].abs().max()) == 0.0
    assert abs(float(weight(x, torch.bfloat16)[0, 0]) - 1.0) < 0.02
