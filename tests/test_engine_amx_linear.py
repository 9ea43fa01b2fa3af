"""The fused layers' bf16 linears of few rows on the AMX kernel against torch.

The reference is ``F.linear`` in float64 on the same bf16 inputs; the bar is torch's own
bf16 linear (oneDNN's, what the kernel replaces for calls of up to ``MAX_ROWS`` rows): both
sum the products in float32 and round each output once to bf16, so the kernel's error must
be of the same size. Also: which calls and models take it, that an engine with it agrees
with the same engine on oneDNN alone and with transformers' float32 as closely, and runs
steps of up to 64 tokens unpadded (no oneDNN primitive per count to bound).
Only where the kernel runs (built, AMX granted).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from embedserve.engine import Batch, Engine, amx_linear, bf16_linear, profiler_names
from embedserve.engine.onednn import FusedLayer, PackedWeight
from embedserve.engine.small_steps import SMALL_STEP_TOKENS
from tests.native_build import require_compiler_for
from tests.native_linear_cases import (
    ACTIVATIONS,
    assert_refuses_bad_calls,
    bf16_layer,
    bf16_rows,
    kernel_calls,
    within_torchs_error,
)


@pytest.fixture
def kernel() -> None:
    if not amx_linear.kernel_available():
        pytest.skip("the AMX linear does not run here: not built, no AMX, or the tile state not granted")


def amx(x: torch.Tensor, layer: nn.Linear, attr: str = "none", algorithm: str = "") -> torch.Tensor:
    bias = (layer.bias.detach() if layer.bias is not None else torch.zeros(layer.out_features)).float()
    return amx_linear.linear(x, bf16_linear.pack_panels(layer.weight.detach()), bias, attr, algorithm)


# rows: one tile (1-16), a full and a short second tile, the largest the layers send;
# widths: e5-small's four shapes, and an odd number of 32-column panels (96: one block of 64
# and one of 32)
@pytest.mark.parametrize("rows", [1, 6, 15, 16, 17, 32, 33, 64])
@pytest.mark.parametrize("in_features,out_features", [(384, 1152), (384, 384), (384, 1536), (1536, 384),
                                                      (32, 96)])
def test_kernel_matches_float64_as_closely_as_torch(kernel: None, rows: int, in_features: int,
                                                    out_features: int) -> None:
    layer = bf16_layer(in_features, out_features)
    x = bf16_rows(rows, in_features)
    within_torchs_error(amx(x, layer), x, layer)


def test_rows_of_a_strided_view(kernel: None) -> None:
    layer = bf16_layer(384, 384)
    x = bf16_rows(20, 1152)[:, 384:768]                 # rows 1152 elements apart
    within_torchs_error(amx(x, layer), x, layer)


@ACTIVATIONS
def test_kernel_applies_the_activation(kernel: None, attr: str, algorithm: str, activation) -> None:
    layer = bf16_layer(384, 1536)
    x = bf16_rows(24, 384)
    within_torchs_error(amx(x, layer, attr, algorithm), x, layer, activation)


def test_the_kernel_refuses_shapes_it_cannot_tile(kernel: None) -> None:
    x, y = bf16_rows(4, 48), torch.empty(4, 64, dtype=torch.bfloat16)
    panels, bias = torch.zeros(2, 24, 32, 2, dtype=torch.bfloat16), torch.zeros(64)
    with pytest.raises(ValueError, match="multiple of 32"):           # 48 input columns
        amx_linear._native.linear(x.data_ptr(), panels.data_ptr(), bias.data_ptr(), y.data_ptr(), 4, 64, 48,
                                  48, 2, 0)
    assert not amx_linear.covers(bf16_layer(48, 64).weight)
    assert not amx_linear.covers(bf16_layer(64, 48).weight)
    assert not amx_linear.covers(bf16_layer(64, 64).weight.float())


@pytest.mark.parametrize("bias", [True, False])
def test_packed_weight_takes_the_kernel_for_few_rows_only(kernel: None, bias: bool) -> None:
    layer = bf16_layer(384, 1536, bias=bias)
    few, onednn = PackedWeight(layer, few_rows=True), PackedWeight(layer)
    assert few.few_rows and not onednn.few_rows and not few.native
    for rows, calls in ((1, 1), (amx_linear.MAX_ROWS, 1), (amx_linear.MAX_ROWS + 1, 0)):
        x = bf16_rows(rows, 384)
        out, entered = kernel_calls(lambda: few(x, "gelu", "none"), profiler_names.AMX_LINEAR)
        assert entered == calls, rows
        within_torchs_error(out, x, layer, F.gelu)
        assert kernel_calls(lambda: onednn(x, "gelu", "none"), profiler_names.AMX_LINEAR)[1] == 0


def test_every_small_step_fits_the_kernel() -> None:
    # the flat loop hands its linears to the kernel without checking each call's rows
    assert SMALL_STEP_TOKENS <= amx_linear.MAX_ROWS


def test_an_engine_with_the_kernel_agrees_with_onednn_and_transformers(kernel: None, tiny_bert_dir: Path,
                                                                        monkeypatch) -> None:
    batches = [Batch.from_sequences([np.arange(4, 4 + n, dtype=np.int32) for n in lengths])
               for lengths in ((6,), (3, 17, 40), (3, 70))]          # flat loop, module path, oneDNN
    with Engine.load(tiny_bert_dir, dtype="bfloat16") as few, Engine.load(tiny_bert_dir, dtype="float32") as exact:
        monkeypatch.setattr(amx_linear, "MAX_WEIGHT_BYTES", 0)       # the model too large for the copy
        with Engine.load(tiny_bert_dir, dtype="bfloat16") as onednn:
            layers = [(engine, [m for m in engine.model.modules() if isinstance(m, FusedLayer)])
                      for engine in (few, onednn)]
            assert all(layer.qkv.few_rows for layer in layers[0][1]) and layers[0][1]
            assert not any(layer.qkv.few_rows for layer in layers[1][1]) and layers[1][1]

            def cosine(a: np.ndarray, b: np.ndarray) -> np.ndarray:
                return (a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)

            for batch in batches:
                ours, theirs, reference = (engine.step(batch).wait() for engine in (few, onednn, exact))
                assert cosine(ours, theirs).min() >= 0.9999
                assert 1 - cosine(ours, reference).min() <= 2 * (1 - cosine(theirs, reference).min()) + 1e-5
            # Up to 64 tokens no oneDNN primitive is built, so no token bucket either: 6 and
            # 60 tokens run as they are, 73 as 80; on oneDNN 6 -> 8 and 60 -> 64 too.
            real = 6 + 60 + 73
            assert few.stats()["padding_waste"] == pytest.approx((6 + 60 + 80 - real) / (6 + 60 + 80))
            assert onednn.stats()["padding_waste"] == pytest.approx((8 + 64 + 80 - real) / (8 + 64 + 80))


def test_the_kernel_is_built_where_the_compiler_can_target_amx(tmp_path: Path) -> None:
    require_compiler_for(tmp_path, ["-mamx-tile", "-mamx-bf16"],
                         "#include <immintrin.h>\nvoid f(void) { _tile_zero(0); }\n")
    assert amx_linear._native is not None, "embedserve.engine._amx_linear was not built"


def test_the_native_call_refuses_an_unknown_activation_and_a_shape_it_cannot_take(kernel) -> None:
    assert_refuses_bad_calls(amx_linear._native.linear, 48, "k a positive multiple of 32.*got rows 2, n 64, k 48")
