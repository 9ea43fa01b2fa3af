"""Whether this machine's C compiler can build the engine's optional native kernels."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest


def require_compiler_for(directory: Path, flags: list[str], source: str) -> None:
    """Skip the calling test unless ``cc`` compiles ``source`` with ``flags`` (an ISA probe)."""
    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        pytest.skip("no C compiler on this machine")
    probe = directory / "probe.c"
    probe.write_text(source)
    compiled = subprocess.run([compiler, "-c", *flags, str(probe), "-o", str(directory / "probe.o")],
                              capture_output=True)
    if compiled.returncode != 0:
        pytest.skip(f"this machine's compiler cannot build with {' '.join(flags)}")
