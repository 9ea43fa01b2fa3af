"""A launcher's children (``launch.processes``): their exits are awaited from the event
loop, and they die with their launcher, each arming Linux's parent-death signal itself,
after exec (``die_with_parent``), for the parent that started it."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from embedserve.entrypoint import GATEWAY_LISTENING, run_event_loop
from embedserve.launch.processes import PARENT_PID_VARIABLE, child_environment, popen_listening, start_child, stop_child
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
LISTENING = re.compile(r"listening on (\d+)")


@pytest.mark.parametrize("pidfds", [True, False], ids=["pidfd", "thread"])
def test_a_childs_exit_is_awaited_from_the_loop(monkeypatch, pidfds):
    if not pidfds:   # as where Linux has no pidfd_open: a thread waits instead
        monkeypatch.delattr(os, "pidfd_open")

    async def run() -> tuple[str, int, int, int]:
        exits, match, output = await start_child(
            [sys.executable, "-c", "print('listening on 7', flush=True); raise SystemExit(3)"], LISTENING, name="one")
        code = await asyncio.wait_for(exits.wait(), 60)
        output.cancel()
        sleeps, _, output = await start_child(
            [sys.executable, "-c", "import time; print('listening on 8', flush=True); time.sleep(60)"],
            LISTENING, name="two")
        stopped = await asyncio.wait_for(stop_child(sleeps, grace_s=10), 60)
        output.cancel()
        return match.group(1), code, exits.returncode, stopped

    assert run_event_loop(run()) == ("7", 3, 3, -signal.SIGTERM)   # uvloop, as the launchers run


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
