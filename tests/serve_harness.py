"""``embedserve serve`` as a real child process for end-to-end tests: start, wait ready, stop.

One place for what every served-model test needs: the stack on port 0 with this
checkout first on the path, the URL from its banner, readiness from ``/ready``
(a replica SERVING for every model), and a SIGTERM stop that must exit 0.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx

from embedserve.entrypoint import GATEWAY_LISTENING
from embedserve.launch.processes import popen_listening, stop_popen

ROOT = Path(__file__).resolve().parents[1]


def wait_ready(url: str, timeout_s: float = 180.0) -> dict:
    deadline = time.monotonic() + timeout_s
    while True:
        reply = httpx.get(url + "/ready", timeout=10)
        if reply.status_code == 200:
            return reply.json()
        if time.monotonic() > deadline:
            raise TimeoutError(f"{url} never became ready: {reply.text}")
        time.sleep(0.1)


def native_tokenizer_backend(url: str, timeout_s: float = 540.0) -> str:
    """``/info``'s tokenizer backend once it is not the ``tokenizers`` library's: a gateway
    whose native kernels were not compiled yet serves with the library meanwhile
    (gateway/startup.py), as in a fresh checkout's first tests."""
    deadline = time.monotonic() + timeout_s
    while True:
        backend = httpx.get(url + "/info", timeout=10).json()["tokenizer_backend"]
        if backend != "tokenizers" or time.monotonic() > deadline:
            return backend
        time.sleep(0.5)


@contextlib.contextmanager
def served(*args: str, stop_grace_s: float = 60.0) -> Iterator[str]:
    """``embedserve serve --port 0 ARGS`` (one replica and float32 unless ARGS say otherwise),
    ready; its URL."""
    if "--replicas" not in args:
        args = ("--replicas", "1", *args)
    if "--dtype" not in args:
        # Tests compare against float32 references; serve's default (auto) may pick bfloat16.
        args = ("--dtype", "float32", *args)
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT), PYTHONUNBUFFERED="1")
    process, match = popen_listening([sys.executable, "-m", "embedserve.cli", "serve", "--port", "0", *args],
                                     GATEWAY_LISTENING, env=env, cwd=str(ROOT))
    try:
        url = match.group(1)
        wait_ready(url)
        yield url
    finally:
        assert stop_popen(process, stop_grace_s) == 0
