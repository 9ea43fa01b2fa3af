"""MKL's reproducible mode, set when the engine is imported (engine/mkl_sums.py).

Each case runs in a process of its own: MKL takes the mode only before its first call.
What the mode is for is tested where it matters: tests/test_engine_lazy.py (rows of steps
computed side by side, bit for bit) and tests/test_bulk_chunk.py (a part's bytes).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# MKL's CNR branch as its service reports it (mkl.h: MKL_CBWR_BRANCH asks for the
# branch; 2 is MKL_CBWR_AUTO), after importing the engine or not, then a float32 matmul.
BRANCH = r"""
import ctypes, sys
from pathlib import Path
import torch
if sys.argv[1] == "engine":
    import embedserve.engine  # noqa: F401
library = ctypes.CDLL(str(Path(torch.__file__).parent / "lib" / "libtorch_cpu.so"))
get = library.mkl_serv_cbwr_get
get.restype, get.argtypes = ctypes.c_int, [ctypes.c_int]
torch.ones(64, 64) @ torch.ones(64, 64)
print(get(1))
"""


def branch(how: str, **env: str) -> int:
    done = subprocess.run([sys.executable, "-c", BRANCH, how], capture_output=True, text=True, timeout=120,
                          env={**{k: v for k, v in os.environ.items() if k != "MKL_CBWR"},
                               "PYTHONPATH": str(ROOT), **env})
    if "mkl_serv_cbwr_get" in done.stderr:
        pytest.skip("this torch build exports no MKL service symbol")
    assert done.returncode == 0, done.stderr[-2000:]
    return int(done.stdout.split()[-1])


def test_importing_the_engine_sets_the_auto_branch_before_mkl_runs() -> None:
    assert branch("plain") != 2
    assert branch("engine") == 2


def test_a_mode_of_the_callers_own_wins() -> None:
    assert branch("engine", MKL_CBWR="COMPATIBLE") == 3   # MKL_CBWR_COMPATIBLE
