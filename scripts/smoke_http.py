"""HTTP side of the compose smoke test (scripts/compose_smoke.py).

Owns talking to a running stack from outside: embeddings from the gateway,
its readiness and metrics, Prometheus' scrape targets, and a concurrent load
that counts every answer as right, wrong or lost. It knows nothing about
Docker: the orchestration lives in compose_smoke.py. Standard library and
numpy only, so the script runs from any environment that has them.
"""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Self

import numpy as np

# Cosine a gateway answer must reach against the reference to count as right.
MIN_COSINE = 0.9999


class SmokeFailure(AssertionError):
    """A check of the smoke test did not hold; the message says which and why."""


def request(url: str, payload: dict | None = None, timeout_s: float = 30.0) -> tuple[int, bytes]:
    """(status, body) of GET ``url``, or POST ``payload`` as JSON; HTTP errors are answers too."""
    data = json.dumps(payload).encode() if payload is not None else None
    headers = {"content-type": "application/json"} if data is not None else {}
    req = urllib.request.Request(url, data=data, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def wait_until(check: Callable[[], bool], timeout_s: float, what: str, interval_s: float = 0.5) -> float:
    """Seconds until ``check()`` is true; SmokeFailure naming ``what`` after ``timeout_s``."""
    start = time.monotonic()
    while True:
        try:
            if check():
                return time.monotonic() - start
        except (OSError, ValueError):  # not up yet: refused, reset, half-written JSON
            pass
        if time.monotonic() - start > timeout_s:
            raise SmokeFailure(f"{what}: not within {timeout_s:.0f} s")
        time.sleep(interval_s)


def is_ready(gateway_url: str) -> bool:
    return request(f"{gateway_url}/ready", timeout_s=3)[0] == 200


def embed(gateway_url: str, texts: Sequence[str], timeout_s: float = 60.0) -> np.ndarray:
    """Vectors for ``texts`` from /v1/embeddings, in input order; SmokeFailure unless 200."""
    status, body = request(f"{gateway_url}/v1/embeddings", {"input": list(texts)}, timeout_s)
    if status != 200:
        raise SmokeFailure(f"/v1/embeddings answered {status}: {body[:300]!r}")
    data = sorted(json.loads(body)["data"], key=lambda item: item["index"])
    # vectors: [len(texts), dim]
    return np.asarray([item["embedding"] for item in data], dtype=np.float32)


def cosines(got: np.ndarray, expected: np.ndarray) -> np.ndarray:
    """Row-wise cosine of two [n, dim] arrays."""
    return (got * expected).sum(1) / (np.linalg.norm(got, axis=1) * np.linalg.norm(expected, axis=1))


def metric_total(text: str, name: str) -> float:
    """Sum of every sample of ``name`` (any labels) in a Prometheus text exposition."""
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name) and line[len(name):len(name) + 1] in ("{", " "):
            total += float(line.rsplit(" ", 1)[1])
    return total


def prometheus_targets(prometheus_url: str) -> list[dict]:
    """Prometheus' active scrape targets: job, scrape URL, health, last error."""
    status, body = request(f"{prometheus_url}/api/v1/targets?state=active", timeout_s=5)
    if status != 200:
        raise SmokeFailure(f"Prometheus /api/v1/targets answered {status}")
    return [{"job": target["labels"]["job"], "url": target["scrapeUrl"], "health": target["health"],
             "error": target.get("lastError", "")}
            for target in json.loads(body)["data"]["activeTargets"]]


@dataclass
class LoadCount:
    """What a concurrent load saw: every request is exactly one of ok, wrong or lost."""

    ok: int = 0
    wrong: int = 0    # 200 with a vector that does not match the reference
    lost: int = 0     # any other answer, or no answer (error, timeout)
    samples: list[str] = field(default_factory=list)  # the first few failures, for the report

    @property
    def sent(self) -> int:
        return self.ok + self.wrong + self.lost


class Load:
    """``clients`` threads posting one text each, back to back, until stopped.

    Every answer is checked against the reference vector of the text sent,
    so a replica dying mid-request shows up as lost (no answer, 5xx) or
    wrong (a bad vector), never silently.
    """

    def __init__(self, gateway_url: str, texts: Sequence[str], reference: np.ndarray, clients: int) -> None:
        self._url = gateway_url
        self._texts = list(texts)
        self._reference = reference
        self._clients = clients
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._count = LoadCount()
        self._threads: list[threading.Thread] = []

    def __enter__(self) -> Self:
        for client in range(self._clients):
            thread = threading.Thread(target=self._run, args=(client,), daemon=True)
            thread.start()
            self._threads.append(thread)
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> LoadCount:
        self._stop.set()
        for thread in self._threads:
            thread.join()
        return self._count

    def _record(self, outcome: str, detail: str = "") -> None:
        with self._lock:
            setattr(self._count, outcome, getattr(self._count, outcome) + 1)
            if detail and len(self._count.samples) < 5:
                self._count.samples.append(detail)

    def _run(self, client: int) -> None:
        turn = client
        while not self._stop.is_set():
            index = turn % len(self._texts)
            turn += 1
            try:
                vector = embed(self._url, [self._texts[index]])
            except SmokeFailure as exc:
                self._record("lost", str(exc))
                continue
            except (OSError, ValueError, KeyError) as exc:
                self._record("lost", f"{type(exc).__name__}: {exc}")
                continue
            cosine = float(cosines(vector, self._reference[index:index + 1])[0])
            if cosine >= MIN_COSINE:
                self._record("ok")
            else:
                self._record("wrong", f"text {index}: cosine {cosine:.6f}")
