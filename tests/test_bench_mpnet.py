"""``python -m bench mpnet --bias-ab`` in its smallest run: a one-layer MPNet, one timed step
per shape. What it prints must be a row per step shape with both sides' times and their
ratio, and the model it kept must be a model; speed is never asserted."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from bench.__main__ import main as bench_main
from embedserve.engine import Engine
from embedserve.engine.modules import bf16_attention


def test_the_bias_ab_prints_a_row_per_step_shape(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    if not bf16_attention.kernel_available():
        pytest.skip("no native bf16 attention here: the kernel is not built or the CPU lacks AVX512-BF16")
    kept = tmp_path / "mpnet"
    assert bench_main(["mpnet", "--bias-ab", "--layers", "1", "--repeats", "1", "--model-dir", str(kept)]) == 0
    rows = re.findall(r"^\| (.+?) \| (\d+\.\d\d) \| (\d+\.\d\d) \| (\d+\.\d\d)x \|$", capsys.readouterr().out,
                      re.MULTILINE)
    assert [name for name, *_ in rows] == ["32 mixed texts (4455 tokens)", "1 x 8 tokens (8 tokens)",
                                           "1 x 32 tokens (31 tokens)"]
    for _, sdpa, kernel, ratio in rows:
        assert float(sdpa) > 0 and float(kernel) > 0
        assert abs(float(ratio) - float(kernel) / float(sdpa)) <= 0.01 + 0.02 * float(ratio)  # rounding
    with Engine.load(kept) as engine:
        assert engine.config.family == "mpnet" and engine.info.dimension == 768
