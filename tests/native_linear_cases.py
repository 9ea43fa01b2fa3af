"""What the native linears' tests share (test_engine_avx2_linear.py,
test_engine_bf16_linear.py, test_engine_amx_linear.py): the layers and rows they build,
the activations oneDNN's epilogues name, counting a call's entries into a kernel, and
the bf16 kernels' bar: as close to float64 as torch's own bf16 linear."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F
from torch import nn

# (attr, algorithm) as oneDNN's epilogues name an activation, and the activation itself.
ACTIVATIONS = pytest.mark.parametrize("attr,algorithm,activation", [
    ("none", "", lambda t: t),
    ("gelu", "none", F.gelu),
    ("gelu", "tanh", lambda t: F.gelu(t, approximate="tanh")),
    ("relu", "", F.relu),
])


def linear_layer(in_features: int, out_features: int, bias: bool = True,
                 dtype: torch.dtype = torch.float32) -> nn.Linear:
    torch.manual_seed(0)
    return nn.Linear(in_features, out_features, bias=bias).to(dtype)


def kernel_calls(call: Callable[[], torch.Tensor], event_name: str) -> tuple[torch.Tensor, int]:
    """``call()``'s result and how many times it entered the kernel profiled as ``event_name``."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as profile:
        out = call()
    return out, sum(event.name == event_name for event in profile.events())


def bf16_layer(in_features: int, out_features: int, bias: bool = True) -> nn.Linear:
    return linear_layer(in_features, out_features, bias, torch.bfloat16)


def bf16_rows(rows: int, features: int) -> torch.Tensor:
    return torch.randn(rows, features, generator=torch.Generator().manual_seed(rows)).to(torch.bfloat16)


def within_torchs_error(out: torch.Tensor, x: torch.Tensor, layer: nn.Linear, activation=lambda t: t) -> None:
    bias = None if layer.bias is None else layer.bias.double()
    expected = activation(F.linear(x.double(), layer.weight.double(), bias))
    torch_error = (activation(F.linear(x, layer.weight, layer.bias)).double() - expected).abs()
    error = (out.double() - expected).abs()
    assert out.dtype == torch.bfloat16 and out.shape == expected.shape
    assert error.max() <= 1.25 * torch_error.max() + 1e-6, (error.max(), torch_error.max())
    assert error.mean() <= 1.1 * torch_error.mean() + 1e-7, (error.mean(), torch_error.mean())
