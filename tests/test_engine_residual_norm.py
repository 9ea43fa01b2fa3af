"""The native residual add + LayerNorm (bf16) against torch's LayerNorm in float32.

The reference is ``F.layer_norm`` in float32 on the exact sum of the bf16 inputs;
the bar is torch's own bf16 path (``add_`` then the bf16 LayerNorm), which the
kernel replaces in the fused CPU layers: its error must not be larger.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from embedserve.engine import residual_norm
from embedserve.engine.residual_norm import ResidualNorm
from tests.native_build import require_compiler_for


@pytest.fixture
def kernel() -> None:
    if not residual_norm.kernel_available():
        pytest.skip("no native add + LayerNorm here: not built, or no AVX-512 BF16 on this CPU")


def bf16_norm(hidden: int, bias: bool = True, seed: int = 0) -> nn.LayerNorm:
    torch.manual_seed(seed)
    norm = nn.LayerNorm(hidden, eps=1e-12, bias=bias)
    with torch.no_grad():
        norm.weight.uniform_(0.5, 1.5)
        if bias:
            norm.bias.uniform_(-0.5, 0.5)
    return norm.to(torch.bfloat16)


def inputs(rows: int, hidden: int, seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return tuple((torch.randn(rows, hidden, generator=generator) * 3 + 1).to(torch.bfloat16) for _ in range(2))


def reference(norm: nn.LayerNorm, y: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
    weight = norm.weight.float()
    bias = None if norm.bias is None else norm.bias.float()
    return F.layer_norm(y.float() + residual.float(), norm.normalized_shape, weight, bias, norm.eps)


@pytest.mark.parametrize("rows,hidden", [(1, 16), (7, 384), (300, 768), (20_000, 384)])
@pytest.mark.parametrize("bias", [True, False])
def test_native_pass_is_at_least_as_close_as_torchs_two_ops(kernel: None, rows: int, hidden: int,
                                                           bias: bool) -> None:
    norm = bf16_norm(hidden, bias)
    fused = ResidualNorm(norm)
    assert fused.native
    y, residual = inputs(rows, hidden)
    expected = reference(norm, y, residual)
    torch_error = (norm(y.clone().add_(residual)).float() - expected).abs()
    out = fused(y.clone(), residual)
    assert out.dtype == torch.bfloat16
    error = (out.float() - expected).abs()
    assert error.max() <= torch_error.max()
    assert error.mean() <= torch_error.mean()


def test_rows_of_strided_views(kernel: None) -> None:
    norm = bf16_norm(384)
    y, wide = inputs(50, 768)
    residual = wide[:, 384:]                         # rows 768 elements apart
    assert residual.stride(0) == 768
    out = ResidualNorm(norm)(y[:, :384].clone(), residual)
    expected = reference(norm, y[:, :384], residual)
    assert (out.float() - expected).abs().max() <= 0.02


def test_the_result_is_written_over_y(kernel: None) -> None:
    norm = bf16_norm(64)
    y, residual = inputs(5, 64)
    out = ResidualNorm(norm)(y, residual)
    assert out.data_ptr() == y.data_ptr()


def test_float32_rows_take_torchs_ops_unchanged() -> None:
    norm = bf16_norm(384).float()
    y, residual = (t.float() for t in inputs(9, 384))
    assert torch.equal(ResidualNorm(norm)(y.clone(), residual), norm(y + residual))


def test_the_kernel_is_built_where_the_compiler_can_target_avx512_bf16(tmp_path: Path) -> None:
    require_compiler_for(tmp_path, ["-mavx512f", "-mavx512bf16"],
                         "#include <immintrin.h>\n__m256bh f(__m512 x) { return _mm512_cvtneps_pbh(x); }\n")
    assert residual_norm._native is not None, "embedserve.engine._add_layer_norm was not built"
