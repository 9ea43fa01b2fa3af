"""SIGTERM under load loses nothing: ``serve`` and ``cluster`` as real processes.

Clients in threads send steady embedding requests to the real command (the
default model, so requests are still running when the signal lands). The
test then stops starting new requests, waits until the gateway has admitted
every request already sent (its ``requests_admitted`` counter), sends
SIGTERM, and lets the clients carry on until each is refused. It checks:

- every request sent before the signal is answered 200 with its vectors;
- every answer is 200 or 503, and each 503 is OpenAI's error shape with
  Retry-After;
- no request is dropped: no reset, no half-answered connection, and no
  refused connection while a request admitted before the signal was still
  unanswered (the gateway keeps its socket open while it drains);
- the process exits 0 and leaves no child behind.

The same for ``serve``, ``cluster`` and a lone ``gateway`` in front of a
replica.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest

from embedserve.entrypoint import GATEWAY_LISTENING
from gateway_harness import SchedulerProcess, metric_value
from process_tree import alive, children

CLIENTS = 8
# ~1,500 tokens per request on e5-small: the requests admitted before the
# signal still run on the replicas when it arrives.
INPUTS = [f"passage: request {i} asks the gateway to finish what it admitted before it stops, "
          "and to refuse politely what arrives after the signal. " * 3 for i in range(12)]
ADMITTED = "embedserve_gateway_requests_admitted_total"


@dataclass
class Tally:
    """What the clients saw, shared between their threads (guarded by ``lock``)."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    holding: bool = False         # set: no new request starts until the signal is sent
    sent_before: int = 0
    outstanding_before: int = 0   # sent before the signal, not yet answered
    before: list[int | str] = field(default_factory=list)
    after: list[int | str] = field(default_factory=list)
    refusals: list[httpx.Response] = field(default_factory=list)
    refused_while_draining: int = 0
    completed: int = 0
    outstanding_at_signal: int = 0


def _client(url: str, tally: Tally, signalled: threading.Event) -> None:
    with httpx.Client(base_url=url, timeout=120, trust_env=False) as http:
        while True:
            with tally.lock:
                if tally.holding:
                    break
                tally.sent_before += 1
                tally.outstanding_before += 1
            outcome = _post(http)
            with tally.lock:
                tally.outstanding_before -= 1
                tally.before.append(outcome if isinstance(outcome, str) else outcome.status_code)
                tally.completed += 1
        signalled.wait()
        while True:
            outcome = _post(http)
            with tally.lock:
                if isinstance(outcome, str):
                    tally.after.append(outcome)
                    if outcome == "ConnectError" and tally.outstanding_before:
                        tally.refused_while_draining += 1
                    return              # the gateway has closed its socket
                tally.after.append(outcome.status_code)
                if outcome.status_code == 503:
                    tally.refusals.append(outcome)
                    return


def _post(http: httpx.Client) -> httpx.Response | str:
    try:
        response = http.post("/v1/embeddings", json={"input": INPUTS})
    except httpx.TransportError as error:
        return type(error).__name__
    if response.status_code == 200:
        assert len(response.json()["data"]) == len(INPUTS)
    return response


def _admitted(url: str) -> float:
    text = httpx.get(f"{url}/metrics", timeout=10, trust_env=False).text
    return metric_value(text, ADMITTED)


def sigterm_under_load(process: subprocess.Popen, url: str) -> Tally:
    """Load ``url`` from CLIENTS threads, SIGTERM ``process`` mid-run; what the clients saw."""
    tally, signalled = Tally(), threading.Event()
    baseline = _admitted(url)
    threads = [threading.Thread(target=_client, args=(url, tally, signalled), daemon=True)
               for _ in range(CLIENTS)]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + 120
    while tally.completed < CLIENTS and time.monotonic() < deadline:
        time.sleep(0.05)              # steady load: every client has been answered once
    with tally.lock:
        tally.holding = True
        sent = tally.sent_before
    # Signal only once the gateway has admitted every request sent so far, so
    # "sent before the signal" means the same thing to the test and the server.
    while _admitted(url) - baseline < sent:
        assert time.monotonic() < deadline, "the gateway never admitted the requests sent"
        time.sleep(0.01)
    with tally.lock:
        process.send_signal(signal.SIGTERM)
        tally.outstanding_at_signal = tally.outstanding_before
    signalled.set()
    for thread in threads:
        thread.join(180)
    return tally


def assert_nothing_lost(tally: Tally) -> None:
    # Without a request running at the signal there would be nothing to drain.
    assert tally.outstanding_at_signal > 0, "every request was answered before the signal"
    assert tally.before and set(tally.before) == {200}, tally.before
    assert set(tally.after) <= {200, 503, "ConnectError"}, tally.after
    assert tally.refused_while_draining == 0, "connection refused while admitted requests ran"
    assert tally.refusals, f"no request was refused with 503 while draining: {tally.after}"
    for response in tally.refusals:
        error = response.json()["error"]
        assert error["type"] == "service_unavailable" and error["code"] == "draining"
        assert int(response.headers["retry-after"]) >= 1


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


def test_serve_sigterm_under_load_loses_nothing(default_model_dir: Path) -> None:
    check_sigterm_loses_nothing(Command("serve", "--model", str(default_model_dir), "--port", "0"))


def test_cluster_sigterm_under_load_loses_nothing(default_model_dir: Path) -> None:
    check_sigterm_loses_nothing(Command("cluster", "--replicas", "1", "--model",
                                        str(default_model_dir), "--port", "0"))


def test_lone_gateway_sigterm_under_load_loses_nothing(default_model_dir: Path) -> None:
    replica = SchedulerProcess(default_model_dir, threads=1)
    try:
        check_sigterm_loses_nothing(Command("gateway", "--model", str(default_model_dir),
                                            "--upstream", replica.address, "--port", "0"))
        # The replica kept serving throughout: the gateway's drain needed it.
        assert replica.process is not None and replica.process.poll() is None
    finally:
        replica.stop()
