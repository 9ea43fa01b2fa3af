"""``embedserve serve``: the whole stack in one command.

N local scheduler+engine processes (``--replicas``) per model and the
gateway in front of them, in this process, building the default model on
first use. Several models: ``--model`` once per model
(``DIR[:name=NAME[,ALIAS...]][:replicas=N]``); each gets its own replicas
and one gateway routes requests by their ``model``. The gateway calls its
replicas over Unix domain sockets in a private temporary directory
(``--replica-transport tcp``: over loopback TCP instead). Prints
``embedserve gateway listening on http://HOST:PORT`` once it accepts requests.
On Ctrl-C or SIGTERM the gateway drains first (new requests get 503, those
admitted are answered), then the replicas drain, then it exits 0.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import tempfile
from pathlib import Path

from embedserve.defaults.model_args import ModelSpec, model_specs_from_args
from embedserve.entrypoint import configure_logging, run_event_loop, stop_on_signals
from embedserve.gateway.cli import add_gateway_flags, gateway_settings, serve_http, served_models
from embedserve.launch.commands import replica_env
from embedserve.launch.processes import first_or_stop
from embedserve.launch.supervisor import ReplicaSupervisor, SupervisorGroup
from embedserve.scheduler.cli import (add_engine_flags, add_priority_flags, cuda_flags,
                                      engine_flags, priority_flags)
from embedserve.scheduler.token_file import read_token_file, temporary_token_file

log = logging.getLogger("embedserve.serve")


def register(subparsers: argparse._SubParsersAction) -> None:
    serve = subparsers.add_parser("serve", help="run replicas and the gateway in one command",
                                  description="Start N scheduler+engine processes and the gateway.")
    serve.add_argument("--replicas", type=int, default=1,
                       help="scheduler+engine processes to start per model (default: "
                            "%(default)s; --model DIR:replicas=N sets one model's); on CPU they "
                            "share the cores, so more replicas add fault tolerance, not speed")
    serve.add_argument("--replica-transport", choices=("unix", "tcp"), default="unix",
                       help="how the gateway calls its local replicas: unix (a Unix domain "
                            "socket each: no TCP loopback per call) or tcp (127.0.0.1 ports, the "
                            "layout of remote replicas). Replicas listen on TCP either way "
                            "(default: %(default)s)")
    add_engine_flags(serve)
    add_priority_flags(serve)
    add_gateway_flags(serve, starts_replicas=True)
    serve.set_defaults(func=run_serve)


def run_serve(args: argparse.Namespace) -> int:
    configure_logging(args.log_level)
    if args.replicas < 1:
        raise SystemExit("--replicas must be at least 1")
    specs = model_specs_from_args(args)
    for spec in specs:
        if spec.upstream is not None:
            raise SystemExit(f"--model {spec.format()}: serve starts each model's replicas itself; "
                             "upstream= is for embedserve gateway")
    # Names are checked before any replica starts.
    served_models(args, specs, [()] * len(specs))
    return run_event_loop(_serve_stack(args, specs))


async def _serve_stack(args: argparse.Namespace, specs: list[ModelSpec]) -> int:
    # A fresh token per run: only this gateway can call these replicas. The
    # sockets' directory is private to this user (mkdtemp makes it 0700).
    with temporary_token_file() as token_file, \
            tempfile.TemporaryDirectory(prefix="embedserve-") as sockets:
        socket_root = Path(sockets) if args.replica_transport == "unix" else None
        return await _serve_with_token(args, specs, token_file, socket_root)


async def _serve_with_token(args: argparse.Namespace, specs: list[ModelSpec], token_file: Path,
                            socket_root: Path | None) -> int:
    counts = [spec.replicas or args.replicas for spec in specs]
    # Replicas of every model share this machine's cores.
    env = replica_env(sum(counts), args.device)
    extra = (*engine_flags(args.dtype, args.cuda_graphs, args.dtype_probe_min_cosine,
                          args.calibration), *cuda_flags(args), *priority_flags(args),
             "--replica-token-file", str(token_file),
             # where replicas keep the int8/uint8 calibration
             *(("--cache-dir", str(args.cache_dir)) if args.cache_dir else ()))
    group = SupervisorGroup([
        ReplicaSupervisor(spec.path, count, args.device, extra_args=extra, env=env,
                          label=_label(spec, len(specs)),
                          unix_socket_dir=None if socket_root is None else socket_root / str(k))
        for k, (spec, count) in enumerate(zip(specs, counts))])
    stop = asyncio.Event()
    with stop_on_signals(stop.set):
        try:
            if not await first_or_stop(asyncio.ensure_future(group.start()), stop):
                return 0
            models = served_models(args, specs, [s.addresses for s in group.supervisors])
            settings = gateway_settings(args, models, read_token_file(token_file))
            return await serve_http(settings, stop)
        finally:
            await group.stop()
            log.info("stopped")


def _label(spec: ModelSpec, model_count: int) -> str:
    """How log lines name a model's replicas: by the model when there are several."""
    if model_count == 1:
        return ""
    assert spec.path is not None
    return spec.names[0] if spec.names else spec.path.name
