"""A pytest plugin (tests/conftest.py loads it): tests/kernel_warmup.py beside the session.

Started by the process that runs the session (the serial test process, or xdist's
controller, which runs no tests), stopped at the session's end if still running,
before the leftover-process check (tests/leftover_processes.py, trylast). Under xdist
both cores run tests, but a fresh checkout's first tests mostly wait: each worker's
first test needs a kernel the other is compiling (seen as half the CPU idle for the
first ~100 s of a cold run, and again at the first SentencePiece and WordPiece
tests). The warmup compiles, at a lower priority, what those waits would otherwise
wait for next. A failure only costs the tests their own compiles, and is reported as
a warning.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import warnings
from pathlib import Path

import pytest

from minilm_model import extract_minilm

ROOT = Path(__file__).resolve().parent.parent
_WARMUP = pytest.StashKey[tuple[subprocess.Popen, Path]]()


def pytest_sessionstart(session: pytest.Session) -> None:
    from embedserve.launch.processes import child_environment

    config = session.config
    if hasattr(config, "workerinput") or config.getoption("collectonly"):
        return
    work = Path(tempfile.mkdtemp(prefix="kernel_warmup-"))
    with (work / "stderr.txt").open("wb") as stderr:
        process = subprocess.Popen(
            [sys.executable, str(ROOT / "tests" / "kernel_warmup.py"), str(extract_minilm(work / "minilm")),
             str(work / "tries")],
            cwd=ROOT, env=child_environment(dict(os.environ, PYTHONPATH=str(ROOT))),
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=stderr)
    config.stash[_WARMUP] = process, work


@pytest.hookimpl(tryfirst=True)
def pytest_sessionfinish(session: pytest.Session) -> None:
    from embedserve.launch.processes import stop_popen

    started = session.config.stash.get(_WARMUP, None)
    if started is None:
        return
    process, work = started
    finished = process.poll() is not None
    status = stop_popen(process, grace_s=10)
    if finished and status != 0:
        warnings.warn(f"tests/kernel_warmup.py exited with status {status}:\n"
                      f"{(work / 'stderr.txt').read_text()[-3000:]}", stacklevel=1)
    shutil.rmtree(work, ignore_errors=True)
