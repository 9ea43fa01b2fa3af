"""SIGTERM under load loses nothing: ``serve`` and a lone ``gateway`` as real processes.

Clients in threads send steady embedding requests to the real command (the
default model, so requests are still running when the signal lands); the
load and the checks are tests/sigterm_load.py's. The test stops starting new
requests, waits until the gateway has admitted every request already sent,
sends SIGTERM, and lets the clients carry on until each is refused. It checks:

- every request sent before the signal is answered 200 with its vectors;
- every answer is 200 or 503, and each 503 is OpenAI's error shape with
  Retry-After;
- no request is dropped: no reset, no half-answered connection, and no
  refused connection while a request admitted before the signal was still
  unanswered (the gateway keeps its socket open while it drains);
- the process exits 0 and leaves no child behind.

The same for a lone ``gateway`` in front of a replica; for ``serve`` it is
the end of tests/test_gateway_serve.py's run (one stack for both). ``cluster``
gets the same check at the end of its one run in tests/test_deploy_cluster.py
(a second cluster start only for this would cost a model load per replica).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

from embedserve.entrypoint import GATEWAY_LISTENING
from process_tree import alive, children
from sigterm_load import assert_nothing_lost, sigterm_under_load


class Command:
    """An ``embedserve`` command as a child process; its output is kept for failures."""

    def __init__(self, *args: str) -> None:
        env = dict(os.environ, PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1")
        self.popen = subprocess.Popen([sys.executable, "-m", "embedserve.cli", *args],
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                      env=env)
        self.lines: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.popen.stdout is not None
        for line in self.popen.stdout:
            self.lines.append(line)

    def gateway_url(self, timeout_s: float = 240) -> str:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and self.popen.poll() is None:
            for line in list(self.lines):
                if match := GATEWAY_LISTENING.search(line):
                    return match.group(1)
            time.sleep(0.1)
        pytest.fail("no gateway banner; output:\n" + self.output())

    def output(self) -> str:
        return "".join(self.lines[-60:])

    def close(self) -> None:
        if self.popen.poll() is None:
            self.popen.kill()
            self.popen.wait(10)


def wait_ready(url: str, timeout_s: float = 240) -> None:
    deadline = time.monotonic() + timeout_s
    while httpx.get(f"{url}/ready", timeout=10, trust_env=False).status_code != 200:
        assert time.monotonic() < deadline, "the gateway never became ready"
        time.sleep(0.1)


def check_sigterm_loses_nothing(command: Command) -> None:
    try:
        url = command.gateway_url()
        wait_ready(url)
        tree = children(command.popen.pid)
        tally = sigterm_under_load(command.popen, url)
        assert command.popen.wait(90) == 0, command.output()
        assert_nothing_lost(tally)
        assert not any(alive(pid) for pid in tree), command.output()
    finally:
        command.close()


def test_lone_gateway_sigterm_under_load_loses_nothing(default_model_dir: Path, default_replica) -> None:
    check_sigterm_loses_nothing(Command("gateway", "--model", str(default_model_dir),
                                        "--upstream", default_replica.address, "--port", "0"))
    # The replica (the session's shared one) kept serving throughout: the gateway's drain needed it.
    assert default_replica.process is not None and default_replica.process.poll() is None


def test_a_kept_alive_connection_is_refused_with_503_after_the_drain_not_cut(
        default_model_dir: Path, default_replica) -> None:
    # The client's connection is idle when the drain ends (nothing admitted is left): the
    # gateway must keep answering it with 503 + Connection: close for a moment before it
    # closes connections, or the client's next request is cut (a transport error).
    command = Command("gateway", "--model", str(default_model_dir), "--upstream",
                      default_replica.address, "--port", "0")
    try:
        url = command.gateway_url()
        wait_ready(url)
        with httpx.Client(base_url=url, timeout=30, trust_env=False) as http:
            assert http.post("/v1/embeddings", json={"input": "kept alive"}).status_code == 200
            command.popen.send_signal(signal.SIGTERM)
            statuses = []
            while not statuses or statuses[-1] == 200:   # 200 until the signal lands
                time.sleep(0.05)
                statuses.append(http.post("/v1/embeddings", json={"input": "next"}).status_code)
                assert len(statuses) < 100, "the gateway never began draining"
        assert statuses[-1] == 503
        assert command.popen.wait(30) == 0, command.output()
    finally:
        command.close()
