"""Child processes of the launchers: start one, learn its address, stop it.

Owns the mechanics every launcher shares: a port free right now, starting a
child that dies with its parent (Linux parent-death signal) in its own
process group, reading the line it prints once it listens (forwarding its
output to ours), keeping the one error line a failed child prints (instead of
forwarding it, so that the launcher reports it once, as its own), stopping it with SIGTERM and then
SIGKILL after a grace period, and "wait for this or for a stop signal, whichever comes first".
Knows nothing about which command a child runs (``commands.py``) or what it
serves.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import os
import re
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Mapping, MutableMapping, Sequence
from typing import TypeVar

from embedserve.entrypoint import ERROR_LINE, StartupError

T = TypeVar("T")

_PR_SET_PDEATHSIG = 1
PARENT_PID_VARIABLE = "EMBEDSERVE_PARENT_PID"


class ChildFailed(StartupError):
    """A child exited, or stayed silent too long, before printing that it listens.

    Its message is the child's own error line when it printed one (the cause and
    the fix, from the child's entry point), prefixed with which child it was.
    """


def free_port(host: str = "127.0.0.1") -> int:
    """A port free right now (bound and released), for a child that must know it in advance.

    Another process could take it before the child binds; that shows up as the
    child's start failing, not as a silent collision.
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def child_environment(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """``env`` (default: this process's) plus what makes an embedserve child die with this
    process: the variable ``die_with_parent`` reads in the child."""
    return {**(os.environ if env is None else env), PARENT_PID_VARIABLE: str(os.getpid())}


def die_with_parent(environ: MutableMapping[str, str]) -> None:
    """In a child started with ``child_environment``: ask Linux to SIGTERM this process
    when its parent dies (parent-death signal). Does nothing when the variable is absent.

    The child arms the signal itself, after exec: a pre-exec hook would run Python
    between fork and exec, which ``Child`` exists to avoid. The variable is removed,
    so that this process's own children do not take its parent for theirs. A parent
    that died before the signal was armed is no longer ``getppid()``, and this process
    exits at once instead.
    """
    parent = environ.pop(PARENT_PID_VARIABLE, None)
    if parent is None or not sys.platform.startswith("linux"):
        return
    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    if os.getppid() != int(parent):
        raise SystemExit(f"the process that started this one (pid {parent}) has exited")


class Child:
    """A child process awaited from the event loop, started without running Python between
    fork and exec.

    ``asyncio.create_subprocess_exec`` on uvloop forks and then runs Python in the child
    (CPython's after-fork hooks) before exec. In a parent with gRPC threads, the
    gateway restarting a replica, that child crashed with SIGSEGV in about one start of
    four. ``subprocess.Popen`` without a pre-exec hook runs no Python there (it uses
    vfork where it can). Its exit is awaited through a pidfd the loop watches, so no
    thread waits per child where Linux has them.
    """

    def __init__(self, popen: subprocess.Popen, stdout: asyncio.StreamReader,
                 stderr: asyncio.StreamReader) -> None:
        self._popen = popen
        self.pid = popen.pid
        self.stdout = stdout
        # The message of the last ``embedserve: error:`` line the child printed.
        self.last_error: str | None = None
        self._stderr = asyncio.ensure_future(self._forward_stderr(stderr))
        self._exited: asyncio.Future[int]
        try:
            pidfd = os.pidfd_open(popen.pid)
        except (AttributeError, OSError):   # no pidfds (not Linux, or before 5.3): a thread waits
            self._exited = asyncio.ensure_future(asyncio.to_thread(popen.wait))
            return
        loop = asyncio.get_running_loop()
        self._exited = loop.create_future()
        loop.add_reader(pidfd, self._on_exit, loop, pidfd)

    @classmethod
    async def start(cls, argv: Sequence[str], env: Mapping[str, str] | None) -> Child:
        """``argv`` in its own session, its stdout a pipe read here, its stderr a pipe
        forwarded to ours line by line (its error line kept, not forwarded)."""
        popen = subprocess.Popen(list(argv), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                 env=child_environment(env), start_new_session=True)
        assert popen.stdout is not None and popen.stderr is not None
        loop = asyncio.get_running_loop()
        stdout, stderr = asyncio.StreamReader(), asyncio.StreamReader()
        await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(stdout), popen.stdout)
        await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(stderr), popen.stderr)
        return cls(popen, stdout, stderr)

    async def _forward_stderr(self, stderr: asyncio.StreamReader) -> None:
        while line := await stderr.readline():
            match = ERROR_LINE.match(line.decode(errors="replace").rstrip("\n"))
            if match:
                self.last_error = match.group(1)
            else:
                sys.stderr.buffer.write(line)
                sys.stderr.flush()

    async def error_after_exit(self, grace_s: float = 2.0) -> str | None:
        """Once the child has exited: its error line's message, after reading what it
        wrote to stderr (up to ``grace_s``: a grandchild may hold the pipe open)."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.shield(self._stderr), grace_s)
        return self.last_error

    def _on_exit(self, loop: asyncio.AbstractEventLoop, pidfd: int) -> None:
        loop.remove_reader(pidfd)
        os.close(pidfd)
        self._exited.set_result(self._popen.wait())   # readable pidfd: reaps at once

    @property
    def returncode(self) -> int | None:
        return self._popen.returncode

    async def wait(self) -> int:
        return await asyncio.shield(self._exited)

    def send_signal(self, signum: int) -> None:
        self._popen.send_signal(signum)   # nothing once reaped: the pid may be another's

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


async def start_child(argv: Sequence[str], listening: re.Pattern[str], *, name: str,
                      env: Mapping[str, str] | None = None, timeout_s: float = 300.0,
                      ) -> tuple[Child, re.Match[str], asyncio.Task[None]]:
    """Start ``argv`` and wait for the line matching ``listening``.

    Returns the process, the match, and the task that keeps forwarding the
    child's output to ours (so its pipe never fills). The child runs in its
    own process group: a Ctrl-C in the terminal reaches only this process,
    which then stops its children in order (the gateway drains before the
    replicas do). Raises ``ChildFailed`` (after killing the child) when it
    exits or stays silent for ``timeout_s`` first.
    """
    process = await Child.start(argv, env)
    try:
        match = await asyncio.wait_for(_read_until(process.stdout, listening), timeout_s)
    except TimeoutError:
        await stop_child(process, grace_s=0)
        raise ChildFailed(f"{name} did not start within {timeout_s:.0f} s",
                          "its log lines above say where it stopped") from None
    except BaseException:
        await stop_child(process, grace_s=0)
        raise
    if match is None:
        code = await process.wait()
        raise child_failed(name, code, await process.error_after_exit())
    return process, match, asyncio.create_task(_forward(process.stdout))


def child_failed(name: str, code: int, error: str | None) -> ChildFailed:
    """The ``ChildFailed`` of a child that exited with ``code`` before listening, saying
    why in the child's own words when it printed its error line."""
    if error is not None:
        return ChildFailed(f"{name}: {error}")
    how = f"was killed by signal {-code}" if code < 0 else f"exited with status {code}"
    return ChildFailed(f"{name} {how} before listening",
                       "its log lines above say why; rerun with --debug for its traceback")


async def _read_until(stdout: asyncio.StreamReader, pattern: re.Pattern[str]) -> re.Match[str] | None:
    while line := await stdout.readline():
        _echo(line)
        match = pattern.search(line.decode(errors="replace"))
        if match:
            return match
    return None


async def _forward(stdout: asyncio.StreamReader) -> None:
    while line := await stdout.readline():
        _echo(line)


def _echo(line: bytes) -> None:
    sys.stdout.buffer.write(line)
    sys.stdout.flush()


async def stop_child(process: Child, grace_s: float) -> int:
    """SIGTERM (a server drains), then SIGKILL after ``grace_s``; the exit status."""
    if process.returncode is None:
        with contextlib.suppress(ProcessLookupError):
            process.send_signal(signal.SIGCONT)   # a stopped process cannot handle SIGTERM
            process.send_signal(signal.SIGTERM)
        try:
            await asyncio.wait_for(process.wait(), grace_s)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                process.kill()
    return await process.wait()


def popen_listening(argv: Sequence[str], listening: re.Pattern[str], *,
                    env: Mapping[str, str] | None = None,
                    cwd: str | None = None) -> tuple[subprocess.Popen, re.Match[str]]:
    """``start_child`` for synchronous harnesses: a ``subprocess.Popen`` and its banner's match.

    The child's output is drained by a daemon thread afterwards, so its pipe never fills.
    """
    process = subprocess.Popen(list(argv), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                               env=None if env is None else dict(env), cwd=cwd)
    assert process.stdout is not None
    for line in process.stdout:
        match = listening.search(line)
        if match:
            threading.Thread(target=process.stdout.read, daemon=True).start()
            return process, match
    process.wait()
    raise ChildFailed(f"{' '.join(argv)} exited with status {process.returncode} before listening")


def stop_popen(process: subprocess.Popen, grace_s: float) -> int:
    """``stop_child`` for a ``subprocess.Popen`` (test and benchmark harnesses)."""
    if process.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            process.send_signal(signal.SIGCONT)
            process.send_signal(signal.SIGTERM)
        try:
            return process.wait(grace_s)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                process.kill()
    return process.wait()


async def first_or_stop(work: asyncio.Future[T], stop: asyncio.Event) -> bool:
    """Wait for ``work`` or ``stop``; True when ``work`` finished first (its error re-raised).

    When ``stop`` comes first, ``work`` is cancelled and awaited, so whatever
    it started is cleaned up by its own handlers before this returns False.
    """
    stopped = asyncio.ensure_future(stop.wait())
    try:
        await asyncio.wait({work, stopped}, return_when=asyncio.FIRST_COMPLETED)  # type: ignore[type-var]  # two result types
    finally:
        stopped.cancel()
    if not work.done():
        work.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await work
        return False
    work.result()  # re-raises the work's error
    return True
