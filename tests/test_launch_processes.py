"""A launcher's children die with it: each arms Linux's parent-death signal itself,
after exec (``launch.processes.die_with_parent``), for the parent that started it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from embedserve.entrypoint import GATEWAY_LISTENING
from embedserve.launch.processes import PARENT_PID_VARIABLE, child_environment, popen_listening
from process_tree import alive, children

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="parent-death signals are Linux's")

ROOT = Path(__file__).resolve().parents[1]
_PR_GET_PDEATHSIG = 2
# Prints the signal armed for this process's parent's death and what its children would inherit.
ARMED = f"""
import ctypes, os
from embedserve.launch.processes import die_with_parent
die_with_parent(os.environ)
armed = ctypes.c_int()
ctypes.CDLL(None).prctl({_PR_GET_PDEATHSIG}, ctypes.byref(armed))
print(armed.value, os.environ.get("{PARENT_PID_VARIABLE}"))
"""


def test_a_child_arms_the_signal_for_its_parent_and_passes_nothing_on():
    started = subprocess.run([sys.executable, "-c", ARMED], env=child_environment(), cwd=ROOT,
                             capture_output=True, text=True, timeout=60)
    assert started.returncode == 0, started.stderr
    assert started.stdout.split() == [str(int(signal.SIGTERM)), "None"]

    plain = subprocess.run([sys.executable, "-c", ARMED], env=dict(os.environ), cwd=ROOT,
                           capture_output=True, text=True, timeout=60)
    assert plain.stdout.split() == ["0", "None"]      # started by anyone else: nothing armed


def test_a_child_whose_parent_is_already_gone_exits():
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    orphan = subprocess.run([sys.executable, "-c", ARMED], cwd=ROOT, capture_output=True, text=True, timeout=60,
                            env=dict(os.environ, **{PARENT_PID_VARIABLE: str(gone.pid)}))
    assert orphan.returncode != 0 and "has exited" in orphan.stderr, orphan


def test_a_serve_killed_with_sigkill_takes_its_replica_with_it(tiny_bert_dir):
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
    process, _ = popen_listening([sys.executable, "-m", "embedserve.cli", "serve", "--port", "0", "--replicas", "1",
                                  "--dtype", "float32", "--model", str(tiny_bert_dir)],
                                 GATEWAY_LISTENING, env=env, cwd=str(ROOT))
    replicas = children(process.pid)
    try:
        assert len(replicas) == 1
        os.kill(process.pid, signal.SIGKILL)   # no chance to stop its replica itself
        process.wait()
        deadline = time.monotonic() + 60
        while alive(replicas[0]) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not alive(replicas[0]), "the replica outlived the serve that started it"
    finally:
        for pid in replicas:
            if alive(pid):
                os.kill(pid, signal.SIGKILL)
