"""Local scheduler replicas as child processes, kept alive until told to stop.

Owns the replicas' life cycle: starting ``embedserve scheduler`` processes
(port 0 at first, learned from the line each prints once it is SERVING),
restarting one that exits unexpectedly on the same port (the gateway's
health watch then puts it back in rotation), and stopping them all at once
(they drain in parallel). A ``ReplicaSupervisor`` keeps one model's
replicas; ``SupervisorGroup`` starts and stops one per served model
together. With ``unix_socket_dir`` each replica also listens on a Unix
domain socket there and its address (what the gateway dials) is that
socket's ``unix:PATH``: a gateway on this machine skips TCP loopback on
every call (and the replica opens no TCP frame port; its frames come over
the socket). Starting and stopping one child is ``processes.py``'s job; the
command line is ``commands.py``'s. Used by ``embedserve serve`` and
``embedserve cluster``.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from embedserve.entrypoint import SCHEDULER_LISTENING
from embedserve.launch.commands import scheduler_command
from embedserve.launch.processes import Child, ChildFailed, start_child, stop_child

log = logging.getLogger(__name__)


@dataclass
class ReplicaProcess:
    index: int
    port: int = 0
    process: Child | None = None
    address: str = ""
    # HOST:PORT of its Prometheus endpoint ("" when it runs without one); a restart keeps it.
    metrics_address: str = ""
    restarts: int = 0
    output: asyncio.Task | None = field(default=None, repr=False)


class ReplicaSupervisor:
    def __init__(self, model_dir: Path, replicas: int, device: str = "cpu", host: str = "127.0.0.1",
                 extra_args: tuple[str, ...] = (), env: Mapping[str, str] | None = None,
                 start_timeout_s: float = 300.0, stop_timeout_s: float = 30.0,
                 label: str = "", unix_socket_dir: Path | None = None) -> None:
        self._model_dir = model_dir
        self._unix_socket_dir = unix_socket_dir
        # Names the model in log lines when several are supervised ("": one model).
        self._label_prefix = f"{label} " if label else ""
        self._device = device
        self._host = host
        self._extra_args = extra_args
        self._env = env
        self._start_timeout_s = start_timeout_s
        self._stop_timeout_s = stop_timeout_s
        self.replicas = [ReplicaProcess(i) for i in range(replicas)]
        self._stopping = False
        self._keeper: asyncio.Task | None = None

    @property
    def addresses(self) -> tuple[str, ...]:
        return tuple(r.address for r in self.replicas)

    @property
    def metrics_urls(self) -> tuple[tuple[str, str], ...]:
        """(address, http://HOST:PORT/metrics) of each replica that serves metrics."""
        return tuple((r.address, f"http://{r.metrics_address}/metrics") for r in self.replicas
                     if r.metrics_address)

    def _label(self, replica: ReplicaProcess) -> str:
        return f"{self._label_prefix}{replica.index}"

    async def start(self) -> tuple[str, ...]:
        """Start every replica and wait until each reports its address."""
        try:
            await asyncio.gather(*(self._spawn(r) for r in self.replicas))
        except BaseException:
            await self.stop()
            raise
        self._keeper = asyncio.create_task(self._keep_alive())
        return self.addresses

    def _unix_socket(self, replica: ReplicaProcess) -> Path | None:
        if self._unix_socket_dir is None:
            return None
        self._unix_socket_dir.mkdir(parents=True, exist_ok=True)
        return self._unix_socket_dir / f"replica-{replica.index}.sock"

    async def _spawn(self, replica: ReplicaProcess) -> None:
        socket_path = self._unix_socket(replica)
        # Its frames go over the Unix socket then: no TCP frame port for nobody to call.
        local = ("--unix-socket", str(socket_path), "--frame-port", "off") if socket_path else ()
        # A restart serves its metrics where the first start did (a scraper keeps its URL).
        metrics = (("--metrics-port", replica.metrics_address.rsplit(":", 1)[1])
                   if replica.metrics_address else ())
        extra = (*self._extra_args, *local, *metrics)
        argv = scheduler_command(self._model_dir, self._host, replica.port, device=self._device,
                                 extra=extra)
        replica.process, match, replica.output = await start_child(
            argv, SCHEDULER_LISTENING, name=f"replica {self._label(replica)}", env=self._env,
            timeout_s=self._start_timeout_s)
        tcp_address = match.group(1)
        replica.metrics_address = "" if match.group(2) == "off" else match.group(2)
        replica.port = int(tcp_address.rsplit(":", 1)[1])
        # A restart binds the same socket path (gRPC replaces a stale socket file).
        replica.address = f"unix:{socket_path}" if socket_path else tcp_address
        log.info("replica %s serving on %s (pid %d)", self._label(replica), replica.address,
                 replica.process.pid)

    async def _keep_alive(self) -> None:
        """Restart a replica that exits while we are not stopping."""
        async def watch(replica: ReplicaProcess) -> None:
            while not self._stopping:
                assert replica.process is not None
                code = await replica.process.wait()
                if self._stopping:
                    return
                replica.restarts += 1
                error = await replica.process.error_after_exit()
                log.warning("replica %s (pid %d) exited with %s%s; restarting on port %d",
                            self._label(replica), replica.process.pid, code,
                            f" ({error})" if error else "", replica.port)
                await asyncio.sleep(min(5.0, 0.5 * replica.restarts))
                try:
                    await self._spawn(replica)
                except (ChildFailed, OSError) as exc:
                    log.error("replica %s failed to restart: %s", self._label(replica), exc)
        await asyncio.gather(*(watch(r) for r in self.replicas))

    async def stop(self) -> None:
        """SIGTERM every replica (they drain in parallel), SIGKILL those still running later."""
        self._stopping = True
        if self._keeper is not None:
            self._keeper.cancel()
        running = [r.process for r in self.replicas if r.process is not None]
        await asyncio.gather(*(stop_child(p, self._stop_timeout_s) for p in running))
        for replica in self.replicas:
            if replica.output is not None:
                replica.output.cancel()


class SupervisorGroup:
    """One ``ReplicaSupervisor`` per served model, started together and stopped together.

    Each keeps (and restarts) its own model's replicas; a start that fails
    for one model stops every model's replicas.
    """

    def __init__(self, supervisors: Sequence[ReplicaSupervisor]) -> None:
        self.supervisors = tuple(supervisors)

    async def start(self) -> None:
        starting = [asyncio.ensure_future(s.start()) for s in self.supervisors]
        try:
            await asyncio.gather(*starting)
        except BaseException:
            # The other models' starts are still running: end them before stopping all.
            for task in starting:
                task.cancel()
            await asyncio.gather(*starting, return_exceptions=True)
            await self.stop()
            raise

    async def stop(self) -> None:
        await asyncio.gather(*(s.stop() for s in self.supervisors))
