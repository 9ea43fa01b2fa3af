"""``embedserve serve``: the whole stack from one command, as a real process tree.

Runs a tiny random BERT (``tiny_bert_dir``) so that three model loads stay
cheap, with two replicas on port 0.
Checks the banner, a request, that a killed replica is restarted and put
back, and that SIGTERM stops the gateway and every replica with status 0.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time

import httpx
import numpy as np


BANNER = re.compile(r"embedserve gateway listening on (http://\S+)")


def children(pid: int) -> list[int]:
    found: list[int] = []
    for task in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{task}/children") as handle:
            found += [int(p) for p in handle.read().split()]
    return found


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().split()[2] != "Z"
    except FileNotFoundError:
        return False


def wait_healthy(url: str, count: int, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        replicas = httpx.get(url + "/info", timeout=10).json()["replicas"]
        if sum(r["healthy"] for r in replicas) == count:
            return
        time.sleep(0.1)
    raise TimeoutError(f"never saw {count} healthy replicas")


def test_serve_runs_restarts_and_stops_cleanly(tiny_bert_dir):
    env = dict(os.environ, OMP_NUM_THREADS="1")
    process = subprocess.Popen(
        [sys.executable, "-m", "embedserve.cli", "serve", "--replicas", "2", "--port", "0",
         "--model", str(tiny_bert_dir), "--served-model-name", "tiny", "tiny-alias"],
        stdout=subprocess.PIPE, text=True, env=env)
    try:
        url = None
        assert process.stdout is not None
        for line in process.stdout:
            match = BANNER.search(line)
            if match:
                url = match.group(1)
                break
        assert url, "serve exited without printing where it listens"
        threading.Thread(target=process.stdout.read, daemon=True).start()
        wait_healthy(url, 2)
        reply = httpx.post(url + "/v1/embeddings", json={"input": ["one command"]}, timeout=60).json()
        vector = np.array(reply["data"][0]["embedding"])
        assert reply["model"] == "tiny"
        models = httpx.get(url + "/v1/models", timeout=10).json()["data"]
        assert [m["id"] for m in models] == ["tiny", "tiny-alias"]
        aliased = httpx.post(url + "/v1/embeddings", json={"input": "x", "model": "tiny-alias"}, timeout=60)
        assert aliased.json()["model"] == "tiny-alias"
        unknown = httpx.post(url + "/v1/embeddings", json={"input": "x", "model": str(tiny_bert_dir)}, timeout=60)
        assert unknown.status_code == 404 and unknown.json()["error"]["code"] == "model_not_found"
        assert vector.shape == (32,) and abs(np.linalg.norm(vector) - 1) < 1e-5

        replicas = children(process.pid)
        assert len(replicas) == 2
        os.kill(replicas[0], signal.SIGKILL)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and (replicas[0] in children(process.pid)
                                               or len(children(process.pid)) < 2):
            time.sleep(0.1)
        wait_healthy(url, 2)          # restarted on its port and back in rotation
        assert httpx.post(url + "/embed", json={"inputs": "again"}, timeout=60).status_code == 200

        current = children(process.pid)
        process.send_signal(signal.SIGTERM)
        assert process.wait(60) == 0
        assert not any(alive(pid) for pid in current)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
