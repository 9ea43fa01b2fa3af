"""What every embedserve process does alike at its entry point.

Owns the event loop every server process runs on (uvloop), the log line
format, the stop signals (SIGTERM and SIGINT, handled on the event loop), and
the one line each server role prints once it listens, together with the
pattern a parent process reads that line back with. The line and its pattern
sit side by side so they cannot drift apart. Knows nothing about what the
processes serve.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import signal
from collections.abc import Callable, Coroutine, Iterator
from typing import Any, TypeVar

import uvloop

T = TypeVar("T")

LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)

# ``embedserve scheduler listening on HOST:PORT metrics HOST:PORT`` ("metrics off"
# without a metrics port). Group 1: the gRPC address; group 2: metrics or "off".
SCHEDULER_LISTENING = re.compile(r"embedserve scheduler listening on (\S+:\d+) metrics (\S+)")
# ``embedserve gateway listening on http://HOST:PORT (replicas: ...)``. Group 1: the URL.
GATEWAY_LISTENING = re.compile(r"embedserve gateway listening on (http://\S+:\d+)")
# ``embedserve gateway gRPC API listening on HOST:PORT`` (``--grpc-port``), printed
# before the HTTP line. Group 1: the address a gRPC channel is opened with.
GATEWAY_GRPC_LISTENING = re.compile(r"embedserve gateway gRPC API listening on (\S+:\d+)")

# ``embedserve: error: CAUSE; WHAT TO DO``: the one line on stderr of a command that
# failed (exit status 2 for what the user can fix). Group 1: the cause and the fix.
ERROR_PREFIX = "embedserve: error: "
ERROR_LINE = re.compile(r"^embedserve: error: (.*)$")


class StartupError(Exception):
    """A failure the user can fix before anything serves: what went wrong and what to do.

    The entry point prints it as one ``error_line`` and exits 2; raised by
    launchers and entry-point helpers (flags, files, ports), never by a transport.
    """

    def __init__(self, cause: str, fix: str = "") -> None:
        super().__init__(f"{cause}; {fix}" if fix else cause)
        self.cause = cause
        self.fix = fix


def error_line(message: str) -> str:
    """``message`` as the one line a failed command prints (newlines folded: one line)."""
    return ERROR_PREFIX + " ".join(message.split())


def run_event_loop(main: Coroutine[Any, Any, T]) -> T:
    """Run a server process's ``main`` to completion on a uvloop event loop.

    uvloop's transports and callbacks are C (libuv): the gateway's HTTP and
    replica calls and the replica's frame socket and batcher hand-offs each cost
    less loop time than on asyncio's own loop (BENCHMARKS.md, stack overhead).
    grpc.aio runs on any asyncio loop (its I/O has threads of its own).
    """
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        return runner.run(main)


def configure_logging(level: str = "info") -> None:
    """The log format every process uses, at ``level`` (a name: info, warning, ...)."""
    logging.basicConfig(level=level.upper(), format=LOG_FORMAT)


def scheduler_banner(host: str, port: int, metrics_port: int | None) -> str:
    metrics = f"{host}:{metrics_port}" if metrics_port is not None else "off"
    return f"embedserve scheduler listening on {host}:{port} metrics {metrics}"


def gateway_banner(host: str, port: int, upstreams: tuple[str, ...]) -> str:
    return f"embedserve gateway listening on http://{host}:{port} (replicas: {', '.join(upstreams)})"


def gateway_grpc_banner(host: str, port: int) -> str:
    address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    return f"embedserve gateway gRPC API listening on {address}"


@contextlib.contextmanager
def stop_on_signals(callback: Callable[[], None]) -> Iterator[None]:
    """Call ``callback`` on the running loop at each SIGTERM or SIGINT while inside the block."""
    loop = asyncio.get_running_loop()
    for sig in STOP_SIGNALS:
        loop.add_signal_handler(sig, callback)
    try:
        yield
    finally:
        for sig in STOP_SIGNALS:
            loop.remove_signal_handler(sig)
