"""Fail the test session if a process a test started is still alive at the end.

A pytest plugin (tests/conftest.py imports its hooks). At session start the
pytest process becomes a child subreaper (``prctl(PR_SET_CHILD_SUBREAPER)``), so
a grandchild whose parent exits (a server started by a CLI that is then killed,
a ``sh -c 'x &'``) is re-parented to pytest instead of to init, and stays
visible as pytest's descendant. At session end every descendant still running
gets a few seconds to exit, then is killed; if any was found the session's exit
status becomes "tests failed" and their command lines are printed.

Under pytest-xdist every process runs this: each worker checks its own
descendants (the processes its tests started, orphans included, since the
worker is a subreaper too) and hands what it found to the controller in its
``workeroutput``; the controller, whose descendants are only the workers, waits
until xdist has stopped them, checks what is left (the orphans of a worker that
died) and reports everything. So one worker never sees the other's servers, and
xdist's own processes are never counted.

Linux only (``/proc`` and ``prctl``); elsewhere it does nothing.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import time
from pathlib import Path

import pytest

PR_SET_CHILD_SUBREAPER = 36
GRACE_SECONDS = 5.0
PROC = Path("/proc")


def _become_subreaper() -> bool:
    if not sys.platform.startswith("linux"):
        return False
    libc = ctypes.CDLL(None, use_errno=True)
    return libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0


def _stat(pid: int) -> tuple[str, int] | None:
    """(state, parent pid) of ``pid``, or None if it is gone."""
    try:
        raw = (PROC / str(pid) / "stat").read_text()
    except OSError:
        return None
    state, ppid = raw[raw.rindex(")") + 2:].split()[:2]   # comm may hold spaces and parens
    return state, int(ppid)


def _reap_zombies() -> None:
    """Collect exited children, ours or re-parented to us, so they stop being listed."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def live_descendants(root: int) -> list[int]:
    """Pids below ``root`` in the process tree that have not exited (zombies excluded)."""
    parent_of: dict[int, int] = {}
    for entry in PROC.iterdir():
        if entry.name.isdigit() and (stat := _stat(int(entry.name))) is not None and stat[0] != "Z":
            parent_of[int(entry.name)] = stat[1]
    found, frontier = [], [root]
    while frontier:
        parent = frontier.pop()
        children = [pid for pid, ppid in parent_of.items() if ppid == parent]
        found += children
        frontier += children
    return sorted(found)


def command_line(pid: int) -> str:
    try:
        raw = (PROC / str(pid) / "cmdline").read_bytes()
    except OSError:
        return "?"
    return raw.replace(b"\0", b" ").decode(errors="replace").strip() or "?"


def stop_leftovers(root: int, grace: float = GRACE_SECONDS) -> list[tuple[int, str]]:
    """Descendants of ``root`` still alive ``grace`` seconds from now, killed: [(pid, command line)].

    The grace lets a process that was already told to stop (a server whose
    fixture signalled it without waiting) finish on its own; only what is still
    running after it counts.
    """
    deadline = time.monotonic() + grace
    while True:
        _reap_zombies()
        running = live_descendants(root)
        if not running or time.monotonic() >= deadline:
            break
        time.sleep(0.1)
    leftovers = [(pid, command_line(pid)) for pid in running]
    for pid, _ in leftovers:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    time.sleep(0.1)
    _reap_zombies()
    return leftovers


def add_grace_option(parser: pytest.Parser) -> None:
    """The ``leftover_grace`` ini value (``-o leftover_grace=S``): this module's
    pytest_addoption, which tests/conftest.py calls from its own."""
    parser.addini("leftover_grace", f"seconds a test's processes get to exit at the session's end before they "
                  f"count as leftovers (default {GRACE_SECONDS})", default=str(GRACE_SECONDS))


pytest_addoption = add_grace_option


def pytest_sessionstart(session: pytest.Session) -> None:
    session.config.stash[_ENABLED] = _become_subreaper()
    session.config.stash[_FROM_WORKERS] = []


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error: object) -> None:
    """xdist's controller: keep what a finished worker found (a crashed one sends nothing;
    its orphans come to the controller, which finds them itself)."""
    found = getattr(node, "workeroutput", {}).get(_OUTPUT_KEY, [])
    node.config.stash.setdefault(_FROM_WORKERS, []).extend(found)


# trylast: in xdist's controller, after xdist's own sessionfinish has stopped the workers.
@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    config = session.config
    if not config.stash.get(_ENABLED, False):
        return
    grace = float(config.getini("leftover_grace"))
    found = [f"pid {pid}: {command}" for pid, command in stop_leftovers(os.getpid(), grace)]
    workeroutput = getattr(config, "workeroutput", None)
    if workeroutput is not None:   # an xdist worker: the controller reports for it
        workeroutput[_OUTPUT_KEY] = found
        return
    found += config.stash.get(_FROM_WORKERS, [])
    if not found:
        return
    lines = [f"{len(found)} process(es) started by tests were still running at the end "
             "of the session (killed now):"]
    lines += [f"  {line}" for line in found]
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None:
        reporter.ensure_newline()
        reporter.write_sep("=", "leftover processes", red=True)
        for line in lines:
            reporter.write_line(line, red=True)
    else:
        print("\n".join(lines), file=sys.stderr)
    session.exitstatus = pytest.ExitCode.TESTS_FAILED


_ENABLED = pytest.StashKey[bool]()
_FROM_WORKERS = pytest.StashKey[list[str]]()   # xdist's controller: what the workers found
_OUTPUT_KEY = "leftover_processes"             # the workeroutput entry a worker fills
