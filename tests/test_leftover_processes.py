"""The session check in leftover_processes.py: a process a test leaves running fails the run.

Each case runs a small pytest session in a subprocess with only that plugin loaded.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

TESTS_DIR = Path(__file__).resolve().parent

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="needs /proc and prctl")


def run_inner_session(directory: Path, test_source: str) -> subprocess.CompletedProcess[str]:
    (directory / "test_inner.py").write_text(textwrap.dedent(test_source))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS_DIR), os.environ.get("PYTHONPATH", "")])}
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "leftover_processes",
               "test_inner.py"]
    return subprocess.run(command, cwd=directory, env=env, capture_output=True, text=True, timeout=120)


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def test_leaked_child_and_orphaned_grandchild_fail_the_run_and_are_killed(tmp_path):
    # A direct child left running, and a grandchild whose parent (sh) has exited: without
    # the subreaper it would belong to init and be invisible to pytest.
    done = run_inner_session(tmp_path, f"""
        import subprocess
        from pathlib import Path

        def test_leaks():
            child = subprocess.Popen(["sleep", "60"])
            subprocess.run(["sh", "-c", "sleep 61 & echo $! > {tmp_path / 'grandchild.pid'}"], check=True)
            Path({str(tmp_path / 'child.pid')!r}).write_text(str(child.pid))
    """)
    output = done.stdout + done.stderr
    assert done.returncode == pytest.ExitCode.TESTS_FAILED, output
    assert "1 passed" in output and "leftover processes" in output
    assert "sleep 60" in output and "sleep 61" in output
    for name in ("child.pid", "grandchild.pid"):
        pid = int((tmp_path / name).read_text())
        assert f"pid {pid}: sleep" in output
        assert not alive(pid)


def test_processes_that_are_waited_for_pass(tmp_path):
    done = run_inner_session(tmp_path, """
        import subprocess

        def test_cleans_up():
            child = subprocess.Popen(["sleep", "60"])
            child.kill()
            child.wait()
            subprocess.run(["sh", "-c", "true & wait"], check=True)
    """)
    output = done.stdout + done.stderr
    assert done.returncode == pytest.ExitCode.OK, output
    assert "leftover processes" not in output
