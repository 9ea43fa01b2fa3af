"""tests/gpu: the CUDA path on a real GPU; every test here skips where torch sees no CUDA device.

Runnable on the GPU machine with that machine's own Python and nothing installed
(scripts/gpu-run.sh does exactly this)::

    PYTHONPATH=$PWD python3 -m pytest tests/gpu --confcutdir=tests/gpu -o addopts="" -p no:cacheprovider

``--confcutdir`` keeps tests/conftest.py out (it needs the project's test extras), and
this file imports nothing but pytest and torch. In the main suite the same tests are
collected and skipped.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch


@pytest.fixture(scope="session", autouse=True)
def _cuda_or_skip() -> None:
    # Session scope: set up before any module fixture builds a model on the device.
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device: tests/gpu runs on a GPU (scripts/gpu-run.sh)")


@pytest.fixture(scope="session")
def measured() -> Iterator[dict]:
    """Figures a test measured (tolerances met, errors seen), written where the GPU run
    collects its results ($EMBEDSERVE_GPU_OUT) so that tolerances rest on measurements."""
    figures: dict = {}
    yield figures
    out = os.environ.get("EMBEDSERVE_GPU_OUT")
    if out and figures:
        Path(out).mkdir(parents=True, exist_ok=True)
        (Path(out) / "tests_measured.json").write_text(json.dumps(figures, indent=1, sort_keys=True))
