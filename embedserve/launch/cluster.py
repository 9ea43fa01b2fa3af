"""``embedserve cluster``: the docker-compose topology as local processes.

    embedserve cluster --replicas 2 [--model DIR[:name=NAME][:replicas=N]]... [--port 8000] [--device cpu]

Starts N ``embedserve scheduler`` replicas per model and one ``embedserve
gateway`` process pointed at them (``--model DIR:upstream=ADDRESSES`` per
model): the processes
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
from dataclasses import dataclass, replace

from embedserve.defaults.model_args import ModelSpec, add_model_spec_arguments, default_cache_dir, model_specs_from_args
from embedserve.entrypoint import GATEWAY_LISTENING, StartupError, configure_logging, run_event_loop, stop_on_signals
from embedserve.gateway.cli import add_grpc_port_flag, add_long_input_flags, long_input_args
from embedserve.gateway.settings import GatewaySettings, check_distinct_names
from embedserve.healthprobe import probe
from embedserve.launch.commands import models_gateway_command, replica_env
from embedserve.launch.preflight import check_cache_dir, check_model_dir, check_port_free
from embedserve.launch.processes import Child, first_or_stop, start_child, stop_child
from embedserve.launch.supervisor import ReplicaSupervisor, SupervisorGroup
from embedserve.link.token_file import temporary_token_file
from embedserve.model.probe_texts import DEFAULT_PROBE_MIN_COSINE
from embedserve.scheduler.cli import add_engine_flags, add_priority_flags, cuda_flags, engine_flags, priority_flags
from embedserve.scheduler.settings import DEFAULT_DTYPE
from embedserve.tracing import add_otlp_endpoint_flag, otlp_endpoint_args

log = logging.getLogger("embedserve.launch.cluster")
# Beyond its drain timeout, the time the gateway may take to close before SIGKILL.
_GATEWAY_EXIT_GRACE_S = 15.0


@dataclass(frozen=True)
class ClusterSettings:
    # Each served model's directory (resolved), names and replica count (None: ``replicas``).
    models: tuple[ModelSpec, ...]
    replicas: int = 2
    device: str = "cpu"
    dtype: str | None = DEFAULT_DTYPE   # auto: by hardware, checked by a load-time probe
    dtype_probe_min_cosine: float = DEFAULT_PROBE_MIN_COSINE
    cuda_graphs: bool = True
    calibration: bool = True      # False: replicas skip int8/uint8 calibration and refuse them
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
    parser.add_argument("--replicas", type=int, default=2,
                        help="scheduler replicas per model (default: %(default)s; "
                             "--model DIR:replicas=N sets one model's)")
    add_model_spec_arguments(parser, replicas=True, upstream=False)
    add_engine_flags(parser)
    add_priority_flags(parser)
    parser.add_argument("--host", default="127.0.0.1", help="address the gateway binds")
    parser.add_argument("--port", type=int, default=8000, help="gateway HTTP port; 0 picks a free one")
    parser.add_argument("--api-key", default=None, help="Bearer key the gateway requires")
    add_grpc_port_flag(parser)
    parser.add_argument("--batch-api-key", action="append", default=[], metavar="KEY",
                        help="a further key whose requests always run in the batch class "
                             "(docs/priority.md); repeatable")
    parser.add_argument("--route-priority", action="append", default=[], metavar="ROUTE=CLASS",
                        help="run every request to ROUTE in CLASS (interactive or batch); repeatable")
    add_long_input_flags(parser)
    add_otlp_endpoint_flag(parser)
    parser.add_argument("--drain-timeout", type=float, default=GatewaySettings.drain_timeout_s,
                        help="after SIGTERM, seconds the gateway lets admitted requests run "
                             "while new ones get 503 (default: %(default)s)")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    configure_logging()
    if args.replicas < 1:
        raise StartupError(f"--replicas {args.replicas}: must be at least 1",
                           "start one replica or more (--replicas 1)")
    gateway_args = (*(("--api-key", args.api_key) if args.api_key else ()), *long_input_args(args),
                    *(("--grpc-port", str(args.grpc_port)) if args.grpc_port is not None else ()),
                    *(arg for key in args.batch_api_key for arg in ("--batch-api-key", key)),
                    *(arg for rule in args.route_priority for arg in ("--route-priority", rule)),
                    *otlp_endpoint_args(args))
    if args.calibration:   # the replicas write int8/uint8 calibration ranges there
        check_cache_dir(args.cache_dir or default_cache_dir())
    specs = model_specs_from_args(args)
    for spec in specs:
        if spec.upstream is not None:
            raise StartupError(f"--model {spec.format()}: the cluster starts each model's "
                               "replicas itself", "drop :upstream= (it is for embedserve gateway)")
    try:
        check_distinct_names([spec.served_names or (spec.model_dir.resolve().name,)
                              for spec in specs])
    except ValueError as exc:
        raise StartupError(str(exc)) from None
    for spec in specs:
        check_model_dir(spec.model_dir)
    check_port_free(args.host, args.port)
    settings = ClusterSettings(models=tuple(specs), replicas=args.replicas,
                               device=args.device, dtype=args.dtype,
                               dtype_probe_min_cosine=args.dtype_probe_min_cosine,
                               cuda_graphs=args.cuda_graphs, calibration=args.calibration,
                               host=args.host, port=args.port, gateway_args=gateway_args,
                               drain_timeout_s=args.drain_timeout,
                               # where replicas keep the int8/uint8 calibration
                               replica_args=(*cuda_flags(args), *priority_flags(args),
                                             *otlp_endpoint_args(args),
                                             *(("--cache-dir", str(args.cache_dir))
                                               if args.cache_dir else ())))
    return run_event_loop(run_cluster(settings))


async def run_cluster(settings: ClusterSettings) -> int:
    """Start replicas, then the gateway; stop on SIGTERM/SIGINT or when the gateway exits."""
    # A fresh token per run, passed to every process: only this gateway can
    # call these replicas.
    with temporary_token_file() as token_file:
        return await _run_cluster_with_token(settings, ("--replica-token-file", str(token_file)))


async def _run_cluster_with_token(settings: ClusterSettings, token_args: tuple[str, ...]) -> int:
    extra = (*engine_flags(settings.dtype, settings.cuda_graphs,
                           settings.dtype_probe_min_cosine, settings.calibration), *token_args,
             *(("--metrics-port", "0") if settings.replica_metrics else ()), *settings.replica_args)
    counts = [spec.replicas or settings.replicas for spec in settings.models]
    # Replicas of every model share this machine's cores.
    env = replica_env(sum(counts), settings.device)
    several = len(settings.models) > 1
    supervisors = SupervisorGroup([
        ReplicaSupervisor(spec.model_dir, count, settings.device, extra_args=extra, env=env,
                          start_timeout_s=settings.start_timeout_s,
                          stop_timeout_s=settings.stop_timeout_s,
                          label=(spec.served_names or (spec.model_dir.name,))[0] if several else "")
        for spec, count in zip(settings.models, counts)])
    gateway: Child | None = None
    gateway_output: asyncio.Task | None = None
    stop = asyncio.Event()
    status = 0
    with stop_on_signals(stop.set):
        try:
            if not await first_or_stop(asyncio.ensure_future(supervisors.start()), stop):
                return 0
            # Each model's own replicas, by address, as the gateway's --model ...:upstream=.
            models = [replace(spec, replicas=None, upstream=",".join(supervisor.addresses))
                      for spec, supervisor in zip(settings.models, supervisors.supervisors)]
            argv = models_gateway_command(models, settings.host, settings.port,
                                          ("--drain-timeout", str(settings.drain_timeout_s),
                                           *token_args, *settings.gateway_args))
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
            replicas = " ".join(a for s in supervisors.supervisors for a in s.addresses)
            print(f"embedserve cluster: gateway {url} (OpenAI: {url}/v1/embeddings), "
                  f"replicas {replicas}", flush=True)
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
            await supervisors.stop()
    return status


async def _wait_ready(url: str, process: Child, timeout_s: float) -> bool:
    """Probe the gateway's /ready until 200, its exit, or ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while process.returncode is None and time.monotonic() < deadline:
        if await asyncio.to_thread(probe, url, 2.0):
            return True
        await asyncio.sleep(0.2)
    return False
