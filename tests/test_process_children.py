"""embedserve/process_children.py against real child processes of this test."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

from embedserve.process_children import living_children


def test_a_child_is_found_whatever_its_name_and_a_zombie_is_not(tmp_path: Path) -> None:
    # The command name sits in parentheses in /proc/PID/stat and may hold ") (" itself.
    odd = tmp_path / "a) 1 (b"
    odd.symlink_to("/bin/sleep")
    child = subprocess.Popen([str(odd), "30"])
    try:
        assert child.pid in living_children(os.getpid())
        assert child.pid not in living_children(os.getppid())
    finally:
        child.kill()
    # Killed, not yet reaped: a zombie, which a caller counts as gone.
    deadline = time.monotonic() + 10
    while child.pid in living_children(os.getpid()) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert child.pid not in living_children(os.getpid())
    assert Path(f"/proc/{child.pid}").exists()    # the zombie is still there
    child.wait()


def test_a_process_that_is_gone_has_no_children() -> None:
    child = subprocess.Popen(["true"])
    child.wait()
    assert living_children(child.pid) == set()
