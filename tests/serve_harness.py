"""``embedserve serve`` as a real child process for end-to-end tests: start, wait ready, stop.

One place for what every served-model test needs: the stack on port 0 with this
checkout first on the path, the URL from its banner, readiness from ``/ready``
(a replica SERVING for every model), and a SIGTERM stop that must exit 0.
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
import time
from collections.abc import Iterator, Mapping
from pathlib import Path

import httpx

from embedserve.entrypoint import GATEWAY_GRPC_LISTENING, GATEWAY_LISTENING
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
def served(*args: str, stop_grace_s: float = 60.0,
           env: Mapping[str, str] | None = None) -> Iterator[str]:
    """``embedserve serve --port 0 ARGS`` (one replica and float32 unless ARGS say otherwise),
    ready; its URL. ``env``: variables to set on top of this process's environment."""
    with _served(args, (GATEWAY_LISTENING,), stop_grace_s, env) as (url,):
        yield url


@contextlib.contextmanager
def served_with_grpc(*args: str, stop_grace_s: float = 60.0,
                     env: Mapping[str, str] | None = None) -> Iterator[tuple[str, str]]:
    """``served`` with ``--grpc-port 0`` too: its URL and its gRPC API's address."""
    with _served(("--grpc-port", "0", *args), (GATEWAY_GRPC_LISTENING, GATEWAY_LISTENING),
                 stop_grace_s, env) as (address, url):
        yield url, address


@contextlib.contextmanager
def _served(args: tuple[str, ...], banners: tuple[re.Pattern[str], ...],
            stop_grace_s: float, env: Mapping[str, str] | None = None) -> Iterator[tuple[str, ...]]:
    """The stack, ready; group 1 of each of ``banners``, matched in the order printed."""
    if "--replicas" not in args:
        args = ("--replicas", "1", *args)
    if "--dtype" not in args:
        # Tests compare against float32 references; serve's default (auto) may pick bfloat16.
        args = ("--dtype", "float32", *args)
    environment = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT), PYTHONUNBUFFERED="1",
                       **(env or {}))
    process, match = popen_listening([sys.executable, "-m", "embedserve.cli", "serve", "--port", "0", *args],
                                     _in_order(banners), env=environment, cwd=str(ROOT))
    try:
        found = match.groups()
        wait_ready(found[banners.index(GATEWAY_LISTENING)])
        yield found
    finally:
        assert stop_popen(process, stop_grace_s) == 0


class _in_order:
    """A pattern for ``popen_listening`` that matches once each of ``banners`` has, in order
    (its ``search`` sees one line at a time); the match's groups are theirs."""

    def __init__(self, banners: tuple[re.Pattern[str], ...]) -> None:
        self._banners = banners
        self._groups: list[str] = []

    def search(self, line: str) -> re.Match[str] | None:
        banner = self._banners[len(self._groups)]
        match = banner.search(line)
        if match is None:
            return None
        self._groups.append(match.group(1))
        if len(self._groups) < len(self._banners):
            return None
        # One match whose groups() are every banner's group 1.
        joined = "\n".join(self._groups)
        return re.fullmatch("\n".join("(.*)" for _ in self._groups), joined)
