"""``embedserve cluster``: the docker-compose topology as local processes.

    embedserve cluster --replicas 2 [--model DIR] [--port 8000] [--device cpu]

Starts N ``embedserve scheduler`` replicas and one ``embedserve gateway``
process pointed at them with ``--upstream``: the processes
deploy/docker-compose.yml runs in containers (here the gateway gets the
replicas' addresses as a list rather than a DNS name), so the topology is
tested without Docker. The replicas are kept by the gateway tier's
``ReplicaSupervisor`` (a replica that dies is restarted on the same port, as
compose's restart policy would; the gateway's health watch takes it back).
SIGTERM or Ctrl-C stops the gateway first (no new requests), then drains
the replicas. If the gateway itself exits, everything stops with its status.

Also owns the command lines for both roles, which the fault suite
(tests/faults/suite.py) starts one by one.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import signal
import socket
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from embedserve.defaults.model_args import add_model_arguments, model_dir_from_args
from embedserve.healthprobe import probe
from embedserve.scheduler.settings import REPLICA_DTYPES

log = logging.getLogger("embedserve.launch.cluster")


def replica_command(model_dir: Path, host: str, port: int, metrics_port: int | None = None,
                    device: str = "cpu", extra: Sequence[str] = ()) -> list[str]:
    """argv of one scheduler replica."""
    argv = [sys.executable, "-m", "embedserve.cli", "scheduler", "--model", str(model_dir),
            "--device", device, "--host", host, "--port", str(port)]
    if metrics_port is not None:
        argv += ["--metrics-port", str(metrics_port)]
    return [*argv, *extra]


def gateway_command(model_dir: Path, upstream: str, host: str, port: int,
                    extra: Sequence[str] = ()) -> list[str]:
    """argv of the gateway; ``upstream`` is ``host:port,...`` or ``dns:NAME:PORT``."""
    return [sys.executable, "-m", "embedserve.cli", "gateway", "--upstream", upstream,
            "--model", str(model_dir), "--host", host, "--port", str(port), *extra]


def free_port(host: str = "127.0.0.1") -> int:
    """A port free right now (bound and released), for a child that must know it in advance."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def replica_args(dtype: str | None, cuda_graphs: bool = True) -> tuple[str, ...]:
    """Scheduler flags that ``serve`` and ``cluster`` pass through to every replica."""
    return (*(("--dtype", dtype) if dtype is not None else ()),
            *(() if cuda_graphs else ("--no-cuda-graphs",)))


def replica_env(replicas: int, device: str) -> dict[str, str]:
    """The environment for replicas: on CPU they split the cores between them."""
    env = dict(os.environ)
    if replicas > 1 and device == "cpu":
        # Without this each replica would start one thread per core.
        env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // replicas)))
    return env


@dataclass(frozen=True)
class ClusterSettings:
    model_dir: Path
    replicas: int = 2
    device: str = "cpu"
    dtype: str | None = None      # None: the engine's default for the device
    host: str = "127.0.0.1"
    port: int = 8000
    # Each replica's Prometheus port is chosen free at start and printed.
    replica_metrics: bool = True
    gateway_args: tuple[str, ...] = ()
    start_timeout_s: float = 300.0
    stop_timeout_s: float = 30.0


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "cluster", help="run the compose topology (gateway + N replicas) as local processes",
        description="Run the docker-compose topology as local processes: N scheduler replicas "
                    "and one gateway process in front of them.")
    parser.add_argument("--replicas", type=int, default=2, help="scheduler replicas (default: %(default)s)")
    add_model_arguments(parser, "model directory (default: multilingual-e5-small, built on first use)")
    parser.add_argument("--device", default="cpu", help="replicas' device: cpu or cuda[:N]")
    parser.add_argument("--dtype", default=None, choices=REPLICA_DTYPES,
                        help="replicas' compute dtype (default: float32 on CPU, bfloat16 on CUDA)")
    parser.add_argument("--host", default="127.0.0.1", help="address the gateway binds")
    parser.add_argument("--port", type=int, default=8000, help="gateway HTTP port; 0 picks a free one")
    parser.add_argument("--api-key", default=None, help="Bearer key the gateway requires")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if args.replicas < 1:
        print("embedserve cluster: --replicas must be at least 1", file=sys.stderr)
        return 2
    model_dir = model_dir_from_args(args)
    port = args.port or free_port(args.host)
    gateway_args = ("--api-key", args.api_key) if args.api_key else ()
    settings = ClusterSettings(model_dir=model_dir, replicas=args.replicas, device=args.device,
                               dtype=args.dtype, host=args.host, port=port,
                               gateway_args=gateway_args)
    return asyncio.run(run_cluster(settings))


async def run_cluster(settings: ClusterSettings) -> int:
    """Start replicas, then the gateway; stop on SIGTERM/SIGINT or when the gateway exits."""
    from embedserve.launch.supervisor import ReplicaSupervisor

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    env = replica_env(settings.replicas, settings.device)
    extra = (*replica_args(settings.dtype),
             *(("--metrics-port", "0") if settings.replica_metrics else ()))
    supervisor = ReplicaSupervisor(settings.model_dir, settings.replicas, settings.device,
                                   extra_args=extra, env=env,
                                   start_timeout_s=settings.start_timeout_s,
                                   stop_timeout_s=settings.stop_timeout_s)
    gateway: asyncio.subprocess.Process | None = None
    status = 0
    try:
        starting = asyncio.ensure_future(supervisor.start())
        if not await _first(starting, stop):
            return 0
        addresses = starting.result()
        argv = gateway_command(settings.model_dir, ",".join(addresses), settings.host,
                               settings.port, settings.gateway_args)
        gateway = await asyncio.create_subprocess_exec(*argv, env=dict(os.environ))
        url = f"http://{settings.host}:{settings.port}"
        ready = asyncio.ensure_future(_wait_ready(f"{url}/ready", gateway, settings.start_timeout_s))
        if not await _first(ready, stop):
            return 0
        if not ready.result():
            print("embedserve cluster: the gateway did not become ready", file=sys.stderr)
            return 1
        print(f"embedserve cluster: gateway {url} (OpenAI: {url}/v1/embeddings), "
              f"replicas {' '.join(addresses)}", flush=True)
        exited = asyncio.ensure_future(gateway.wait())
        if await _first(exited, stop):
            status = exited.result() or 1
            log.error("the gateway exited with status %s; stopping the cluster", exited.result())
    finally:
        if gateway is not None and gateway.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                gateway.send_signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(gateway.wait(), settings.stop_timeout_s)
            except TimeoutError:
                gateway.kill()
                await gateway.wait()
        await supervisor.stop()
    return status


async def _first(task: asyncio.Future, stop: asyncio.Event) -> bool:
    """Wait for ``task`` or ``stop``; True when ``task`` finished first (its error re-raised)."""
    stopped = asyncio.ensure_future(stop.wait())
    try:
        await asyncio.wait({task, stopped}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        stopped.cancel()
    if not task.done():
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        return False
    task.result()  # re-raises the task's error
    return True


async def _wait_ready(url: str, process: asyncio.subprocess.Process, timeout_s: float) -> bool:
    """Probe the gateway's /ready until 200, its exit, or ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while process.returncode is None and time.monotonic() < deadline:
        if await asyncio.to_thread(probe, url, 2.0):
            return True
        await asyncio.sleep(0.2)
    return False
