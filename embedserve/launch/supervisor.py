"""Local scheduler replicas as child processes, kept alive until told to stop.

Owns starting ``embedserve scheduler`` processes (port 0 at first, learned
from the line each prints once it is SERVING), restarting one that exits
unexpectedly on the same port (the gateway's health watch then puts it back
in rotation), and stopping them all: SIGTERM (they drain), then SIGKILL
after a grace period. Children also get SIGTERM if this process dies
without cleaning up (Linux parent-death signal). Used by ``embedserve
serve``; ``embedserve cluster`` can reuse it.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import logging
import re
import signal
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

log = logging.getLogger(__name__)

_LISTENING = re.compile(rb"listening on (\S+:\d+)")
_PR_SET_PDEATHSIG = 1


def _die_with_parent_hook() -> Callable[[], None] | None:
    """A pre-exec hook that asks Linux to SIGTERM the child when this process dies.

    prctl is looked up here, in the parent: loading a library between fork and exec
    (``ctypes.CDLL`` in the child) can deadlock on a loader lock that another thread of
    the parent held at fork time. The hook itself only calls the resolved function.
    """
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None

    def hook() -> None:
        prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)

    return hook


@dataclass
class ReplicaProcess:
    index: int
    args: list[str]
    port: int = 0
    process: asyncio.subprocess.Process | None = None
    address: str = ""
    restarts: int = 0
    pump: asyncio.Task | None = field(default=None, repr=False)


class ReplicaSupervisor:
    def __init__(self, model_dir: Path, replicas: int, device: str = "cpu", host: str = "127.0.0.1",
                 extra_args: tuple[str, ...] = (), env: dict[str, str] | None = None,
                 start_timeout_s: float = 300.0, stop_timeout_s: float = 30.0) -> None:
        self._base = [sys.executable, "-m", "embedserve.cli", "scheduler", "--model", str(model_dir),
                      "--device", device, "--host", host, *extra_args]
        self._env = env
        self._start_timeout_s = start_timeout_s
        self._stop_timeout_s = stop_timeout_s
        self._pre_exec = _die_with_parent_hook()
        self.replicas = [ReplicaProcess(i, self._base) for i in range(replicas)]
        self._stopping = False
        self._keeper: asyncio.Task | None = None

    @property
    def addresses(self) -> tuple[str, ...]:
        return tuple(r.address for r in self.replicas)

    async def start(self) -> tuple[str, ...]:
        """Start every replica and wait until each reports its address."""
        try:
            await asyncio.gather(*(self._spawn(r) for r in self.replicas))
        except BaseException:
            await self.stop()
            raise
        self._keeper = asyncio.create_task(self._keep_alive())
        return self.addresses

    async def _spawn(self, replica: ReplicaProcess) -> None:
        command = [*replica.args, "--port", str(replica.port)]
        replica.process = await asyncio.create_subprocess_exec(
            *command, stdout=asyncio.subprocess.PIPE, env=self._env, preexec_fn=self._pre_exec)
        assert replica.process.stdout is not None
        try:
            address = await asyncio.wait_for(self._read_address(replica.process.stdout),
                                             self._start_timeout_s)
        except TimeoutError:
            raise RuntimeError(f"replica {replica.index} did not start within "
                               f"{self._start_timeout_s:.0f} s") from None
        if address is None:
            code = await replica.process.wait()
            raise RuntimeError(f"replica {replica.index} exited with status {code} before serving")
        replica.address = address
        replica.port = int(address.rsplit(":", 1)[1])
        # Keep draining its stdout so the pipe never fills and blocks it.
        replica.pump = asyncio.create_task(self._forward(replica.process.stdout))
        log.info("replica %d serving on %s (pid %d)", replica.index, address, replica.process.pid)

    @staticmethod
    async def _read_address(stdout: asyncio.StreamReader) -> str | None:
        while line := await stdout.readline():
            sys.stdout.buffer.write(line)
            sys.stdout.flush()
            match = _LISTENING.search(line)
            if match:
                return match.group(1).decode()
        return None

    @staticmethod
    async def _forward(stdout: asyncio.StreamReader) -> None:
        while line := await stdout.readline():
            sys.stdout.buffer.write(line)
            sys.stdout.flush()

    async def _keep_alive(self) -> None:
        """Restart a replica that exits while we are not stopping."""
        async def watch(replica: ReplicaProcess) -> None:
            while not self._stopping:
                assert replica.process is not None
                code = await replica.process.wait()
                if self._stopping:
                    return
                replica.restarts += 1
                log.warning("replica %d (pid %d) exited with %s; restarting on port %d",
                            replica.index, replica.process.pid, code, replica.port)
                await asyncio.sleep(min(5.0, 0.5 * replica.restarts))
                try:
                    await self._spawn(replica)
                except (RuntimeError, OSError) as exc:
                    log.error("replica %d failed to restart: %s", replica.index, exc)
        await asyncio.gather(*(watch(r) for r in self.replicas))

    async def stop(self) -> None:
        """SIGTERM every replica (they drain), SIGKILL those still running later."""
        self._stopping = True
        if self._keeper is not None:
            self._keeper.cancel()
        running = [r.process for r in self.replicas
                   if r.process is not None and r.process.returncode is None]
        for process in running:
            with contextlib.suppress(ProcessLookupError):
                process.send_signal(signal.SIGTERM)
        for process in running:
            try:
                await asyncio.wait_for(process.wait(), self._stop_timeout_s)
            except TimeoutError:
                with contextlib.suppress(ProcessLookupError):
                    process.kill()
                await process.wait()
        for replica in self.replicas:
            if replica.pump is not None:
                replica.pump.cancel()
