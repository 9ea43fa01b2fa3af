"""MKL's float32 GEMMs in Conditional Numerical Reproducibility, strict mode.

Why: torch's CPU wheels run float32 matmuls on MKL, and MKL's results for the same GEMM
moved with what else was running: on an AMD EPYC family 26 host, a step computed beside
another on the lanes (runners/cpu.py) gave rows ~1e-7 away from the same step alone, and
`embedserve embed` wrote other bytes for a part run alone than for the same part inside
a whole run, which resume relies on (tests/test_engine_lazy.py, tests/test_bulk_chunk.py;
both pass there with MKL_CBWR=AUTO,STRICT and fail without it). Intel documents strict
mode as bitwise reproducible for ?gemm on its AVX2 and AVX-512 branches even when the
number of threads changes. bf16 and int8 steps do not use MKL (native kernels, oneDNN).

MKL takes the mode only before its first call, so the engine package calls this when it
is imported (engine/__init__.py); where MKL has already run, or the torch build has no
MKL (or does not export its service symbol), nothing changes. A ``MKL_CBWR`` of the
caller's own wins.
"""

from __future__ import annotations

import ctypes
import os
from pathlib import Path

# mkl.h: MKL_CBWR_AUTO, MKL_CBWR_STRICT.
_CBWR_AUTO = 2
_CBWR_STRICT = 0x10000


def keep_mkl_sums_reproducible() -> None:
    """Set MKL's strict reproducible mode in torch's own MKL (its ``libtorch_cpu.so``), where
    it can (MKL refuses once it has run: the sums then stay as they were)."""
    if "MKL_CBWR" in os.environ:
        return
    import torch

    try:
        library = ctypes.CDLL(str(Path(torch.__file__).parent / "lib" / "libtorch_cpu.so"))
        set_mode = library.mkl_serv_cbwr_set
    except (OSError, AttributeError):   # no such library, or an MKL-less build
        return
    set_mode.restype = ctypes.c_int
    set_mode.argtypes = [ctypes.c_int]
    set_mode(_CBWR_AUTO | _CBWR_STRICT)
