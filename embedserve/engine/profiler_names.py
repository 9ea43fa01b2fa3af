"""Names for native kernels in ``torch.profiler`` traces, which otherwise see torch ops only."""

from __future__ import annotations

import contextlib
from contextlib import AbstractContextManager

import torch

BF16_ATTENTION = "embedserve::bf16_attention"
ADD_LAYER_NORM = "embedserve::add_layer_norm"
AVX2_LINEAR = "embedserve::avx2_linear"
BF16_LINEAR = "embedserve::bf16_linear"
AMX_LINEAR = "embedserve::amx_linear"
INT8_LINEAR = "embedserve::int8_linear"


def named(name: str) -> AbstractContextManager[object]:
    """A profiler range called ``name`` while a profiler records; nothing (no cost) otherwise."""
    if torch.autograd.profiler._is_profiler_enabled:
        return torch.profiler.record_function(name)
    return contextlib.nullcontext()
