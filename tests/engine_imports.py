"""Which modules loading a model pulls in, read from a fresh interpreter."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def modules_after_load(*model_dirs: Path) -> set[str]:
    """``sys.modules`` of a new Python after ``Engine.load`` of each dir and one step."""
    script = ("import json, sys\n"
              "import numpy as np\n"
              "from embedserve.engine import Batch, Engine\n"
              f"for d in {[str(d) for d in model_dirs]!r}:\n"
              "    with Engine.load(d, dtype='auto') as engine:\n"
              "        engine.step(Batch.from_sequences([np.array([0, 5, 9, 2], np.int32)],\n"
              "                                         task=engine.info.task)).wait()\n"
              "print(json.dumps(sorted(sys.modules)))\n")
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=ROOT,
                            timeout=300)
    assert result.returncode == 0, result.stderr
    return set(json.loads(result.stdout.strip().splitlines()[-1]))


# Imports a replica's start must not pay for: torch._dynamo (~1.7 s; nn.Embedding's own
# random init on the meta device pulls it in) and sympy (~0.6 s; materializing meta
# parameters with ``to_empty`` pulls it in), each for values the checkpoint replaces.
SLOW_IMPORTS = {"torch._dynamo", "sympy"}


def slow_imports_after_load(*model_dirs: Path) -> set[str]:
    """Which of SLOW_IMPORTS loading ``model_dirs`` (and one step of each) pulled in."""
    return SLOW_IMPORTS & modules_after_load(*model_dirs)
