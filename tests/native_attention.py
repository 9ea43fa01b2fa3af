"""For tests of models on the native bf16 attention kernel (engine/modules/bf16_attention.py):
skip where it does not run, and record which of a step's calls carried a bias."""

from __future__ import annotations

import pytest

from embedserve.engine.modules import bf16_attention


def require_native_attention() -> None:
    if not bf16_attention.kernel_available():
        pytest.skip("no native bf16 attention here: the kernel is not built or the CPU lacks AVX512-BF16")


def record_kernel_biases(monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    """From now on, each ``attend_sequences`` call appends whether it was given a bias."""
    biases: list[bool] = []
    kernel = bf16_attention.attend_sequences

    def recorded(*args, **kwargs):
        biases.append(kwargs.get("bias") is not None)
        return kernel(*args, **kwargs)

    monkeypatch.setattr(bf16_attention, "attend_sequences", recorded)
    return biases
