"""``python -m bench native_kernels --quick``: its tables, and the engine agreeing with itself.

Timings are not checked (benchmarks report them); what is checked is that every
comparison the benchmark prints ran on the same work with the same answer: the
lowest cosine between the two ways of running each engine step is printed and
must be >= 0.9999.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from bench import native_kernels
from embedserve.engine.modules import bf16_attention


def test_quick_run_prints_all_three_tables(default_model_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    if not bf16_attention.kernel_available():
        pytest.skip("no native bf16 attention here: the kernel is not built or the CPU lacks AVX512-BF16")
    assert native_kernels.main(["--quick", "--repeats", "1"]) == 0
    lines = capsys.readouterr().out.splitlines()
    attention = [line for line in lines if line.startswith(("| 32 |", "| 64 |"))]
    assert len(attention) == 4                                   # 2 head sizes x 2 quick shapes
    engine_rows = [line for line in lines if line.startswith(("| 4 x 128 |", "| mixed 8 |"))]
    assert len(engine_rows) == 4                                 # 2 engine tables x 2 quick shapes
    for row in engine_rows:
        cells = [cell.strip() for cell in row.strip("|").split("|")]
        assert float(cells[-1]) >= 0.9999, row
