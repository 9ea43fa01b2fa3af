"""The gateway's frame channel to one replica, kept open while the replica serves.

The replica pool (gateway/replicas.py) starts a keeper when a replica's health says
SERVING and closes it when the health watch ends. The keeper opens a ``FrameChannel``
to where the replica's frames are (``target``: read anew on each try, as a restarted
replica may name another TCP frame port), and again whenever it closes; the replica's
calls go over gRPC whenever ``channel`` is None. A replica that refuses the frame
version (a rolling upgrade mixes releases) or whose frame port leads to another
process is not tried again until the pool starts the keeper anew, on the replica's
next SERVING (docs/replica-link.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from pathlib import Path

import grpc

from embedserve.link.frame_client import FrameChannel, FrameTarget, FrameVersionMismatch, ReplicaCallError

# Logged as the replica pool's: an operator reads a replica's story in one logger.
log = logging.getLogger("embedserve.gateway.replicas")

# A frame channel's connect and HELLO; the wait for the first try before a replica
# that just became SERVING enters rotation (it enters over gRPC when that runs out);
# the longest wait between tries.
FRAME_OPEN_TIMEOUT_S = 10.0
FRAME_FIRST_TRY_S = 2.0
FRAME_RETRY_MAX_S = 30.0


class FrameKeeper:
    """Keeps one replica's frame channel open. ``channel``: the open one, or None."""

    def __init__(self, address: str, token: str | None, keepalive_s: float, backoff_s: float,
                 target: Callable[[], FrameTarget | None], instance_id: Callable[[], str]) -> None:
        self.address = address
        self.channel: FrameChannel | None = None
        self._token = token
        self._keepalive_s = keepalive_s
        self._backoff_s = backoff_s
        self._target = target
        self._instance_id = instance_id
        self._task: asyncio.Task | None = None

    async def start(self) -> None:
        """Start keeping the channel open, unless it is kept already; wait (briefly) for
        the first try, so the replica's first calls already go over it."""
        if self._task is not None and not self._task.done():
            return
        first_try = asyncio.Event()
        self._task = asyncio.create_task(self._kept_open(first_try))
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(FRAME_FIRST_TRY_S):
                await first_try.wait()

    def close(self) -> None:
        """Stop keeping it, and close it (its calls in flight fail as UNAVAILABLE)."""
        if self._task is not None:
            self._task.cancel()
            self._task = None
        if self.channel is not None:
            self.channel.close()
            self.channel = None

    async def _kept_open(self, first_try: asyncio.Event) -> None:
        """Open the channel, and again whenever it closes, until cancelled (the replica
        stopped serving). Its calls go over gRPC whenever none is open: a port that
        does not answer, a replica busy past the timeout, or a connection lost."""
        delay = self._backoff_s
        failures = 0
        try:
            while (target := self._target()) is not None:
                try:
                    channel = await FrameChannel.open(target, self._token, timeout_s=FRAME_OPEN_TIMEOUT_S,
                                                      instance_id=self._instance_id(),
                                                      keepalive_s=self._keepalive_s)
                except (OSError, TimeoutError, ReplicaCallError) as error:
                    failures += 1
                    if isinstance(error, FrameVersionMismatch):
                        # A rolling upgrade: gRPC names each method, frames number them, so
                        # only gRPC is safe across releases. Tried again once the replica
                        # serves anew (a restart may bring it to this release).
                        log.warning("replica %s: frame channel refused at %s: %s; calling it "
                                    "over gRPC", self.address, _describe(target), error.details())
                        return
                    if isinstance(error, ReplicaCallError) and \
                            error.code() is grpc.StatusCode.FAILED_PRECONDITION:
                        log.warning("replica %s: %s at %s (is its address a load-balanced "
                                    "one? use one address per replica, e.g. dns:NAME:PORT of a "
                                    "headless service); calling it over gRPC",
                                    self.address, error.details(), _describe(target))
                        return
                    log.log(logging.INFO if failures == 1 else logging.DEBUG,
                            "replica %s: no frame channel at %s (%s); calling it over gRPC, "
                            "retrying", self.address, _describe(target),
                            str(error) or type(error).__name__)
                    first_try.set()
                    await asyncio.sleep(delay)
                    delay = min(delay * 2, FRAME_RETRY_MAX_S)
                    continue
                self.channel = channel
                first_try.set()
                if failures:
                    log.info("replica %s: frame channel open at %s", self.address, _describe(target))
                delay, failures = self._backoff_s, 0
                await channel.wait_lost()
                if self.channel is channel:
                    self.channel = None
                log.info("replica %s: its frame channel closed; calling it over gRPC meanwhile",
                         self.address)
                await asyncio.sleep(delay)
        finally:
            first_try.set()


def _describe(target: FrameTarget) -> str:
    return str(target) if isinstance(target, Path) else f"{target[0]}:{target[1]}"
