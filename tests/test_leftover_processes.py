"""The session check in leftover_processes.py: a process a test leaves running fails the run.

Each case runs a small pytest session in a subprocess with only that plugin loaded
(and pytest-xdist, for the cases that run it on two worker processes).
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


def run_inner_session(directory: Path, test_source: str, *options: str) -> subprocess.CompletedProcess[str]:
    (directory / "test_inner.py").write_text(textwrap.dedent(test_source))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS_DIR), os.environ.get("PYTHONPATH", "")])}
    # The leaking cases' sleeps are never told to stop: a short grace, not the suite's 5 s.
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "leftover_processes",
               "-o", "leftover_grace=0.5", *options, "test_inner.py"]
    return subprocess.run(command, cwd=directory, env=env, capture_output=True, text=True, timeout=120)


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def leaking_test(tmp_path: Path) -> str:
    # A direct child left running, and a grandchild whose parent (sh) has exited: without
    # the subreaper it would belong to init and be invisible to pytest. The pid files are
    # named after the test's process (under xdist each worker runs it).
    return f"""
        import os
        import subprocess
        from pathlib import Path

        def test_leaks():
            me = os.getpid()
            child = subprocess.Popen(["sleep", "60"])
            subprocess.run(["sh", "-c", f"sleep 61 & echo $! > {tmp_path}/grandchild-{{me}}.pid"], check=True)
            Path(f"{tmp_path}/child-{{me}}.pid").write_text(str(child.pid))
    """


CLEAN_TEST = """
    import subprocess

    def test_cleans_up():
        child = subprocess.Popen(["sleep", "60"])
        child.kill()
        child.wait()
        subprocess.run(["sh", "-c", "true & wait"], check=True)
"""

# Two worker processes, each running every test (--dist=each): each worker finds its
# own leftovers and the controller reports them all; neither the other worker nor
# xdist's own processes count as leftovers.
XDIST = ("-p", "xdist", "--numprocesses=2", "--dist=each")


def assert_leaks_reported_and_killed(done: subprocess.CompletedProcess[str], tmp_path: Path, runs: int,
                                     passed: int) -> None:
    """``runs`` runs of leaking_test's test each left its two sleeps; ``passed`` tests passed."""
    output = done.stdout + done.stderr
    assert done.returncode == pytest.ExitCode.TESTS_FAILED, output
    assert f"{passed} passed" in output and "leftover processes" in output
    assert f"{2 * runs} process(es) started by tests" in output   # the sleeps, nothing else
    pid_files = sorted(tmp_path.glob("*child-*.pid"))
    assert len(pid_files) == 2 * runs
    for path in pid_files:
        pid = int(path.read_text())
        assert f"pid {pid}: sleep" in output
        assert not alive(pid)


def test_leaked_child_and_orphaned_grandchild_fail_the_run_and_are_killed(tmp_path):
    done = run_inner_session(tmp_path, leaking_test(tmp_path))
    assert_leaks_reported_and_killed(done, tmp_path, runs=1, passed=1)


def test_processes_that_are_waited_for_pass(tmp_path):
    done = run_inner_session(tmp_path, CLEAN_TEST)
    output = done.stdout + done.stderr
    assert done.returncode == pytest.ExitCode.OK, output
    assert "leftover processes" not in output


def test_under_xdist_a_workers_leftovers_fail_the_run_and_are_killed(tmp_path):
    pytest.importorskip("xdist")
    source = textwrap.dedent(leaking_test(tmp_path)) + textwrap.dedent(CLEAN_TEST)
    done = run_inner_session(tmp_path, source, *XDIST)
    # Each worker ran both tests; only the leaking one's processes are reported.
    assert_leaks_reported_and_killed(done, tmp_path, runs=2, passed=4)
