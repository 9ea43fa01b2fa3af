"""``embedserve cluster``: the docker-compose topology as local processes.

    embedserve cluster --replicas 2 [--model DIR] [--port 8000] [--device cpu]

Starts N ``embedserve scheduler`` replicas and one ``embedserve gateway``
process pointed at them with ``--upstream``: the processes
deploy/docker-compose.yml runs in containers (here the gateway gets the
replicas' addresses as a list rather than a DNS name), so the topology is
tested without Docker. The replicas are kept by ``ReplicaSupervisor`` (a
replica that dies is restarted on the same port, as compose's restart
policy would; the gateway's health watch takes it back). SIGTERM or Ctrl-C
stops the gateway first (it drains: new requests get 503, those admitted
are answered), then drains the replicas. If the gateway itself exits,
everything stops with its status.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from embedserve.defaults.model_args import add_model_arguments, model_dir_from_args
from embedserve.entrypoint import GATEWAY_LISTENING, configure_logging, stop_on_signals
from embedserve.gateway.settings import GatewaySettings
from embedserve.healthprobe import probe
from embedserve.launch.commands import gateway_command, replica_env
from embedserve.launch.processes import first_or_stop, start_child, stop_child
from embedserve.launch.supervisor import ReplicaSupervisor
from embedserve.scheduler.cli import add_engine_flags, engine_flags
from embedserve.scheduler.token_file import temporary_token_file

log = logging.getLogger("embedserve.launch.cluster")
# Beyond its drain timeout, the time the gateway may take to close before SIGKILL.
_GATEWAY_EXIT_GRACE_S = 15.0


@dataclass(frozen=True)
class ClusterSettings:
    model_dir: Path
    replicas: int = 2
    device: str = "cpu"
    dtype: str | None = None      # None: the engine's default for the device
    cuda_graphs: bool = True
    host: str = "127.0.0.1"
    port: int = 8000              # 0: the gateway picks a free port and prints it
    # Each replica's Prometheus port is chosen free at start and printed.
    replica_metrics: bool = True
    # Further flags for each role (credentials, limits), appended to its command line.
    replica_args: tuple[str, ...] = ()
    gateway_args: tuple[str, ...] = ()
    drain_timeout_s: float = GatewaySettings.drain_timeout_s
    start_timeout_s: float = 300.0
    stop_timeout_s: float = 30.0


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "cluster", help="run the compose topology (gateway + N replicas) as local processes",
        description="Run the docker-compose topology as local processes: N scheduler replicas "
                    "and one gateway process in front of them.")
    parser.add_argument("--replicas", type=int, default=2, help="scheduler replicas (default: %(default)s)")
    add_model_arguments(parser, "model directory (default: multilingual-e5-small, built on first use)")
    add_engine_flags(parser)
    parser.add_argument("--host", default="127.0.0.1", help="address the gateway binds")
    parser.add_argument("--port", type=int, default=8000, help="gateway HTTP port; 0 picks a free one")
    parser.add_argument("--api-key", default=None, help="Bearer key the gateway requires")
    parser.add_argument("--drain-timeout", type=float, default=GatewaySettings.drain_timeout_s,
                        help="after SIGTERM, seconds the gateway lets admitted requests run "
                             "while new ones get 503 (default: %(default)s)")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    configure_logging()
    if args.replicas < 1:
        print("embedserve cluster: --replicas must be at least 1", file=sys.stderr)
        return 2
    gateway_args = ("--api-key", args.api_key) if args.api_key else ()
    settings = ClusterSettings(model_dir=model_dir_from_args(args), replicas=args.replicas,
                               device=args.device, dtype=args.dtype, cuda_graphs=args.cuda_graphs,
                               host=args.host, port=args.port, gateway_args=gateway_args,
                               drain_timeout_s=args.drain_timeout,
                               # where replicas keep the int8/uint8 calibration
                               replica_args=("--cache-dir", str(args.cache_dir))
                               if args.cache_dir else ())
    return asyncio.run(run_cluster(settings))


async def run_cluster(settings: ClusterSettings) -> int:
    """Start replicas, then the gateway; stop on SIGTERM/SIGINT or when the gateway exits."""
    # A fresh token per run, passed to every process: only this gateway can
    # call these replicas.
    with temporary_token_file() as token_file:
        return await _run_cluster_with_token(settings, ("--replica-token-file", str(token_file)))


async def _run_cluster_with_token(settings: ClusterSettings, token_args: tuple[str, ...]) -> int:
    extra = (*engine_flags(settings.dtype, settings.cuda_graphs), *token_args,
             *(("--metrics-port", "0") if settings.replica_metrics else ()), *settings.replica_args)
    supervisor = ReplicaSupervisor(settings.model_dir, settings.replicas, settings.device,
                                   extra_args=extra,
                                   env=replica_env(settings.replicas, settings.device),
                                   start_timeout_s=settings.start_timeout_s,
                                   stop_timeout_s=settings.stop_timeout_s)
    gateway: asyncio.subprocess.Process | None = None
    gateway_output: asyncio.Task | None = None
    stop = asyncio.Event()
    status = 0
    with stop_on_signals(stop.set):
        try:
            if not await first_or_stop(asyncio.ensure_future(supervisor.start()), stop):
                return 0
            argv = gateway_command(settings.model_dir, ",".join(supervisor.addresses),
                                   settings.host, settings.port,
                                   ("--drain-timeout", str(settings.drain_timeout_s), *token_args,
                                    *settings.gateway_args))
            starting = asyncio.ensure_future(start_child(argv, GATEWAY_LISTENING, name="the gateway",
                                                         timeout_s=settings.start_timeout_s))
            if not await first_or_stop(starting, stop):
                return 0
            gateway, listening, gateway_output = starting.result()
            url = listening.group(1)
            ready = asyncio.ensure_future(_wait_ready(f"{url}/ready", gateway,
                                                      settings.start_timeout_s))
            if not await first_or_stop(ready, stop):
                return 0
            if not ready.result():
                print("embedserve cluster: the gateway did not become ready", file=sys.stderr)
                return 1
            print(f"embedserve cluster: gateway {url} (OpenAI: {url}/v1/embeddings), "
                  f"replicas {' '.join(supervisor.addresses)}", flush=True)
            exited = asyncio.ensure_future(gateway.wait())
            if await first_or_stop(exited, stop):
                status = exited.result() or 1
                log.error("the gateway exited with status %s; stopping the cluster", exited.result())
        finally:
            if gateway is not None:
                code = await stop_child(gateway, settings.drain_timeout_s + _GATEWAY_EXIT_GRACE_S)
                if code != 0 and status == 0:
                    log.error("the gateway exited with status %s while stopping", code)
                    status = 1
            if gateway_output is not None:
                gateway_output.cancel()
            await supervisor.stop()
    return status


async def _wait_ready(url: str, process: asyncio.subprocess.Process, timeout_s: float) -> bool:
    """Probe the gateway's /ready until 200, its exit, or ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while process.returncode is None and time.monotonic() < deadline:
        if await asyncio.to_thread(probe, url, 2.0):
            return True
        await asyncio.sleep(0.2)
    return False
