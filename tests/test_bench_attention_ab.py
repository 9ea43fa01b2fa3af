"""The benches that time an attention on the native kernel against torch's SDPA, in their
smallest runs (one layer, one timed step per shape): ``python -m bench mpnet --bias-ab``
(MPNet's relative position bias) and ``python -m bench modernbert --local-ab`` (ModernBERT's
local windows). What each prints must be a row per step shape with both sides' times and
their ratio; speed is never asserted."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from bench.__main__ import main as bench_main
from embedserve.engine import Engine
from native_attention import require_native_attention


@pytest.fixture(autouse=True)
def kernel() -> None:
    require_native_attention()


def test_mpnet_bias_ab_prints_a_row_per_step_shape(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
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


def test_modernbert_local_ab_prints_a_row_per_step_shape(capsys: pytest.CaptureFixture[str]) -> None:
    assert bench_main(["modernbert", "--local-ab", "--layers", "1", "--repeats", "1"]) == 0
    rows = re.findall(r"^\| (.+?) \| (\d+) \| (\d+\.\d\d) \| (\d+\.\d\d) \| (\d+\.\d\d)x \|$",
                      capsys.readouterr().out, re.MULTILINE)
    assert [(name, int(tokens)) for name, tokens, *_ in rows] == [
        ("8 x 512", 4096), ("32 mixed, 8-512", 4459), ("1 x 8", 8), ("4 x 1024", 4096), ("1 x 2048", 2048)]
    for *_, banded, kernel, ratio in rows:
        assert float(banded) > 0 and float(kernel) > 0
        assert abs(float(ratio) - float(kernel) / float(banded)) <= 0.01 + 0.02 * float(ratio)  # rounding
