"""bench/without_amx.py: a process that hides AMX runs every kernel's non-AMX path."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

PROBE = """
from bench.without_amx import hide_amx
hide_amx()
import os
from embedserve.engine import amx_linear, bf16_linear, int8_linear
from embedserve.engine.modules import bf16_attention
print(os.environ["ONEDNN_MAX_CPU_ISA"], "amx" in bf16_attention.available_paths(), amx_linear.kernel_available(),
      int8_linear.tiles_available(), bf16_linear.kernel_available() == bf16_linear.kernel_runs_here())
"""


def test_hiding_amx_takes_every_kernel_off_its_amx_path() -> None:
    out = subprocess.run([sys.executable, "-c", PROBE], cwd=ROOT, capture_output=True, text=True, check=True,
                         timeout=120).stdout.split()
    assert out == ["AVX512_CORE_BF16", "False", "False", "False", "True"]


def test_hiding_amx_after_torch_loaded_is_refused() -> None:
    probe = "import torch\nfrom bench.without_amx import hide_amx\nhide_amx()"
    result = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode != 0 and "before torch is imported" in result.stderr
