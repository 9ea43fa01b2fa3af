"""The fused layers' bf16 linear on the AVX512-BF16 kernel against torch.

The reference is ``F.linear`` in float64 on the same bf16 inputs; the bar is torch's
own bf16 linear (what the kernel replaces): both sum the products in float32 and round
each output once to bf16, so the kernel's error must be of the same size (the order
of the float32 sums differs). Also: which layers take the kernel, that an engine on it
runs steps of up to 64 tokens unpadded (the kernel keeps no per-count state), and that
it agrees with the same engine on oneDNN.
The kernel's own tests run wherever the CPU has its instructions (``runs_here``);
those of the layers' choice only where layers take it (``kernel``).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from embedserve.engine import Batch, Engine, bf16_linear, profiler_names
from embedserve.engine.onednn import PackedWeight, linears_all_native
from tests.native_build import require_compiler_for
from tests.native_linear_cases import (
    ACTIVATIONS,
    assert_refuses_bad_calls,
    bf16_layer,
    bf16_rows,
    helper_threads,
    kernel_calls,
    mismatches_at_once,
    within_torchs_error,
)


@pytest.fixture
def runs_here() -> None:
    if not bf16_linear.kernel_runs_here():
        pytest.skip("the bf16 linear cannot run here: not built, or no AVX512-BF16")


@pytest.fixture
def kernel() -> None:
    if not bf16_linear.kernel_available():
        pytest.skip("the bf16 linear does not run here: not built, no AVX512-BF16, or AMX (oneDNN keeps every call)")


@pytest.mark.parametrize("rows", [1, 2, 11, 12, 13, 20, 24, 95, 96, 97, 300])
@pytest.mark.parametrize("in_features,out_features", [(384, 1536), (1536, 384), (6, 32), (384, 1152)])
def test_kernel_matches_float64_as_closely_as_torch(runs_here: None, rows: int, in_features: int,
                                                    out_features: int) -> None:
    layer = bf16_layer(in_features, out_features)
    x = bf16_rows(rows, in_features)
    out = bf16_linear.linear(x, bf16_linear.pack_panels(layer.weight), layer.bias.detach().float())
    within_torchs_error(out, x, layer)


def test_rows_of_a_strided_view(runs_here: None) -> None:
    layer = bf16_layer(384, 384)
    wide = bf16_rows(20, 1152)
    x = wide[:, 384:768]                            # rows 1152 elements apart
    out = bf16_linear.linear(x, bf16_linear.pack_panels(layer.weight), layer.bias.detach().float())
    within_torchs_error(out, x, layer)


@ACTIVATIONS
def test_kernel_applies_the_activation(runs_here: None, attr: str, algorithm: str, activation) -> None:
    layer = bf16_layer(384, 1536)
    x = bf16_rows(64, 384)
    out = bf16_linear.linear(x, bf16_linear.pack_panels(layer.weight), layer.bias.detach().float(), attr, algorithm)
    within_torchs_error(out, x, layer, activation)


@ACTIVATIONS
@pytest.mark.parametrize("bias", [True, False])
def test_packed_weight_runs_on_the_kernel_with_its_activation(kernel: None, attr: str, algorithm: str,
                                                              activation, bias: bool) -> None:
    layer = bf16_layer(384, 1536, bias=bias)
    native, onednn = PackedWeight(layer), PackedWeight(layer, native=False)
    assert native.native and not onednn.native
    for rows in (3, 64, 300):
        x = bf16_rows(rows, 384)
        expected = activation(F.linear(x.double(), layer.weight.double(),
                                       None if layer.bias is None else layer.bias.double()))
        out, calls = kernel_calls(lambda: native(x, attr, algorithm), profiler_names.BF16_LINEAR)
        assert calls == 1
        reference, calls = kernel_calls(lambda: onednn(x, attr, algorithm), profiler_names.BF16_LINEAR)
        assert calls == 0
        # Both apply the activation to the float32 sum and round once: errors of one size.
        error, onednn_error = ((t.double() - expected).abs() for t in (out, reference))
        assert out.dtype == torch.bfloat16 and out.shape == expected.shape
        assert error.mean() <= 1.1 * onednn_error.mean() + 1e-7, (error.mean(), onednn_error.mean())
        assert error.max() <= 1.25 * onednn_error.max() + 1e-6, (error.max(), onednn_error.max())


def test_float32_and_odd_widths_stay_off_the_kernel(kernel: None) -> None:
    assert not bf16_linear.covers(bf16_layer(384, 1536).weight.detach().float())
    assert not PackedWeight(bf16_layer(384, 48)).native            # not a multiple of 32
    assert not PackedWeight(bf16_layer(7, 32)).native              # odd input width


def test_an_engine_on_the_kernel_runs_short_steps_unpadded_and_agrees_with_onednn(
        kernel: None, tiny_bert_dir: Path) -> None:
    short = Batch.from_sequences([np.arange(4, 4 + n, dtype=np.int32) for n in (3, 17, 40)])  # 60 -> 64
    long = Batch.from_sequences([np.arange(4, 4 + n, dtype=np.int32) for n in (3, 70)])       # 73 -> 80
    with (Engine.load(tiny_bert_dir, dtype="bfloat16") as native,
          Engine.load(tiny_bert_dir, dtype="bfloat16", native_linears=False) as onednn,
          Engine.load(tiny_bert_dir, dtype="float32") as exact):
        assert linears_all_native(native.model)
        assert not linears_all_native(onednn.model)
        ours, theirs, reference = (engine.step(short).wait() for engine in (native, onednn, exact))
        assert native.stats()["padding_waste"] == 0 and onednn.stats()["padding_waste"] == 4 / 64

        def cosine(a: np.ndarray, b: np.ndarray) -> np.ndarray:
            return (a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)

        assert cosine(ours, theirs).min() >= 0.9999
        # as close to float32 as oneDNN's bf16 is, within a small margin
        assert 1 - cosine(ours, reference).min() <= 2 * (1 - cosine(theirs, reference).min()) + 1e-5
        native.step(long).wait()                   # above 64 tokens the buckets stay
        assert native.stats()["padding_waste"] == (80 - 73) / (60 + 80)


def test_the_kernel_is_built_where_the_compiler_can_target_avx512_bf16(tmp_path: Path) -> None:
    require_compiler_for(tmp_path, ["-mavx512f", "-mavx512bf16"],
                         "#include <immintrin.h>\n__m512 f(__m512 a, __m512bh b, __m512bh c) "
                         "{ return _mm512_dpbf16_ps(a, b, c); }\n")
    assert bf16_linear._native is not None, "embedserve.engine._bf16_linear was not built"


def test_the_native_call_refuses_an_unknown_activation_and_a_shape_it_cannot_take(runs_here) -> None:
    assert_refuses_bad_calls(bf16_linear._native.linear, 63, "k > 0 even.*got rows 2, n 64, k 63")


def native_call(x: torch.Tensor, panels: torch.Tensor, bias: torch.Tensor, threads: int,
                activation: int = 0) -> torch.Tensor:
    rows, out_features = x.shape[0], panels.shape[0] * bf16_linear.PANEL
    y = torch.full((rows, out_features), float("nan"), dtype=torch.bfloat16)
    bf16_linear._native.linear(x.data_ptr(), panels.data_ptr(), bias.data_ptr(), y.data_ptr(), rows, out_features,
                               x.shape[1], x.stride(0), threads, activation)
    return y


@pytest.mark.parametrize("rows", [1, 6, 12, 13, 32, 64, 97])
@pytest.mark.parametrize("in_features,out_features", [(384, 1152), (1536, 384), (64, 64)])
@pytest.mark.parametrize("activation", [0, 1])
def test_the_helper_team_gives_one_threads_bits(runs_here: None, rows: int, in_features: int, out_features: int,
                                                activation: int) -> None:
    """``threads=HELPER_TEAM`` splits a call's panels between this thread and the helper
    (a replica's short steps): every output written, each the same bits as one thread's,
    and the helper is a thread of its own."""
    layer = bf16_layer(in_features, out_features)
    x, panels, bias = bf16_rows(rows, in_features), bf16_linear.pack_panels(layer.weight), layer.bias.detach().float()
    alone = native_call(x, panels, bias, 1, activation)
    within_torchs_error(alone, x, layer, F.gelu if activation else (lambda t: t))
    for _ in range(3):
        assert torch.equal(native_call(x, panels, bias, bf16_linear.HELPER_TEAM, activation), alone)
    assert helper_threads() == 1


def test_calls_from_several_threads_at_once_each_get_their_own_rows(runs_here: None) -> None:
    """One call at a time holds the helper; the others run alone meanwhile: no call waits
    on another's items, none gets another's outputs."""
    layer = bf16_layer(384, 1536)
    panels, bias = bf16_linear.pack_panels(layer.weight), layer.bias.detach().float()
    inputs = [bf16_rows(rows, 384) for rows in (6, 7, 20, 32)]
    expected = [native_call(x, panels, bias, 1) for x in inputs]
    calls = [lambda x=x: native_call(x, panels, bias, bf16_linear.HELPER_TEAM) for x in inputs]
    assert mismatches_at_once(calls, expected, 300) == []


FORKED_HELPER = r"""
import os, sys
import torch
from embedserve.engine import bf16_linear
from tests.native_linear_cases import helper_threads
from tests.test_engine_bf16_linear import native_call
from tests.native_linear_cases import bf16_layer, bf16_rows

layer = bf16_layer(384, 1152)
x, panels, bias = bf16_rows(6, 384), bf16_linear.pack_panels(layer.weight), layer.bias.detach().float()
alone = native_call(x, panels, bias, 1)
assert torch.equal(native_call(x, panels, bias, bf16_linear.HELPER_TEAM), alone)
assert helper_threads() == 1
pid = os.fork()
if pid == 0:   # no helper thread came with the fork: the first call starts one
    ok = helper_threads() == 0 and all(torch.equal(native_call(x, panels, bias, bf16_linear.HELPER_TEAM), alone)
                                       for _ in range(50)) and helper_threads() == 1
    os._exit(0 if ok else 1)
_, status = os.waitpid(pid, 0)
assert os.waitstatus_to_exitcode(status) == 0, status
assert torch.equal(native_call(x, panels, bias, bf16_linear.HELPER_TEAM), alone)
print("forked ok")
"""


def test_a_forked_child_starts_a_helper_of_its_own(runs_here: None) -> None:
    root = Path(__file__).resolve().parents[1]
    done = subprocess.run([sys.executable, "-c", FORKED_HELPER], env=dict(os.environ, PYTHONPATH=str(root)),
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip().endswith("forked ok"), done.stderr[-3000:]
