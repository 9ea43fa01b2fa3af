"""What the native linears' tests share (test_engine_avx2_linear.py,
test_engine_bf16_linear.py, test_engine_amx_linear.py): the layers and rows they build,
the activations oneDNN's epilogues name, counting a call's entries into a kernel, calls
from several threads at once, the kernels' helper threads, and the bf16 kernels' bar: as close to float64 as torch's
own bf16 linear."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from pathlib import Path

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


def assert_refuses_bad_calls(linear: Callable[..., None], bad_k: int, shape_message: str) -> None:
    """A bf16 panel kernel's native ``linear`` (its arguments read by panel_linear_args.h)
    refuses an unknown activation, an input width ``bad_k`` it cannot take (a ValueError
    matching ``shape_message``) and a call without the activation, before it reads any data."""
    x, y = torch.zeros(2, 64, dtype=torch.bfloat16), torch.empty(2, 64, dtype=torch.bfloat16)
    panels, bias = torch.zeros(2, 32, 32, 2, dtype=torch.bfloat16), torch.zeros(64)
    pointers = (x.data_ptr(), panels.data_ptr(), bias.data_ptr(), y.data_ptr())
    for activation in (-1, 4):
        with pytest.raises(ValueError, match=f"activation must be 0 to 3, got {activation}"):
            linear(*pointers, 2, 64, 64, 64, 1, activation)
    with pytest.raises(ValueError, match=shape_message):
        linear(*pointers, 2, 64, bad_k, 64, 1, 0)
    with pytest.raises(TypeError):
        linear(*pointers, 2, 64, 64, 64, 1)


def mismatches_at_once(calls: list[Callable[[], torch.Tensor]], expected: list[torch.Tensor],
                       repeats: int) -> list[int]:
    """Runs each of ``calls`` ``repeats`` times on a thread of its own, all at once; the
    indices of the calls that returned other than their ``expected`` (once per time).
    Fails if a thread has not ended within two minutes (a call hung)."""
    mismatches: list[int] = []

    def repeat(i: int) -> None:
        for _ in range(repeats):
            if not torch.equal(calls[i](), expected[i]):
                mismatches.append(i)
    threads = [threading.Thread(target=repeat, args=(i,)) for i in range(len(calls))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert not any(thread.is_alive() for thread in threads), "a call hung"
    return mismatches


def helper_threads() -> int:
    """This process's threads named as the native linears' helper (csrc/helper_team.h); a
    thread that ends between the listing and the read (a test's own, just joined) is not one."""
    return sum(_thread_name(tid) == "embedserve-help" for tid in os.listdir("/proc/self/task"))


def _thread_name(tid: str) -> str | None:
    try:
        return Path(f"/proc/self/task/{tid}/comm").read_text().strip()
    except FileNotFoundError:
        return None
