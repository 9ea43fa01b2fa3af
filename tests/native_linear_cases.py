"""What the native linears' tests share (test_engine_avx2_linear.py and
test_engine_bf16_linear.py): the layers they build, the activations oneDNN's epilogues
name, and counting a call's entries into a kernel."""

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
