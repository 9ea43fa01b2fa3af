"""SIGTERM under load: clients that keep a real gateway busy while the signal lands.

``sigterm_under_load`` sends steady embedding requests from threads, stops
starting new ones, waits until the gateway has admitted every request already
sent (its ``requests_admitted`` counter), sends SIGTERM, and lets the clients
carry on until each is refused; ``assert_nothing_lost`` checks what they saw.
Used by tests/test_launch_shutdown.py (``serve``, a lone ``gateway``) and
tests/test_deploy_cluster.py (``cluster``, at the end of its one run).
"""

from __future__ import annotations

import signal
import subprocess
import threading
import time
from dataclasses import dataclass, field

import httpx

from gateway_harness import metric_value

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
