"""``embedserve serve``: the whole stack in one command.

N local scheduler+engine processes (``--replicas``) and the gateway in front
of them, in this process, building the default model on first use. Prints
``embedserve gateway listening on http://HOST:PORT`` once it accepts requests.
On Ctrl-C or SIGTERM the gateway drains first (new requests get 503, those
admitted are answered), then the replicas drain, then it exits 0.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
from pathlib import Path

from embedserve.defaults.model_args import model_dir_from_args
from embedserve.entrypoint import configure_logging, stop_on_signals
from embedserve.gateway.cli import add_gateway_flags, gateway_settings, serve_http
from embedserve.launch.commands import replica_env
from embedserve.launch.processes import first_or_stop
from embedserve.launch.supervisor import ReplicaSupervisor
from embedserve.scheduler.cli import add_engine_flags, engine_flags
from embedserve.scheduler.token_file import read_token_file, temporary_token_file

log = logging.getLogger("embedserve.serve")


def register(subparsers: argparse._SubParsersAction) -> None:
    serve = subparsers.add_parser("serve", help="run replicas and the gateway in one command",
                                  description="Start N scheduler+engine processes and the gateway.")
    serve.add_argument("--replicas", type=int, default=1,
                       help="scheduler+engine processes to start (default: %(default)s); on CPU "
                            "they share the cores, so more replicas add fault tolerance, not speed")
    add_engine_flags(serve)
    add_gateway_flags(serve)
    serve.set_defaults(func=run_serve)


def run_serve(args: argparse.Namespace) -> int:
    configure_logging(args.log_level)
    if args.replicas < 1:
        raise SystemExit("--replicas must be at least 1")
    model_dir = model_dir_from_args(args)
    return asyncio.run(_serve_stack(args, model_dir))


async def _serve_stack(args: argparse.Namespace, model_dir: Path) -> int:
    # A fresh token per run: only this gateway can call these replicas.
    with temporary_token_file() as token_file:
        return await _serve_with_token(args, model_dir, token_file)


async def _serve_with_token(args: argparse.Namespace, model_dir: Path, token_file: Path) -> int:
    supervisor = ReplicaSupervisor(model_dir, args.replicas, args.device,
                                   extra_args=(*engine_flags(args.dtype, args.cuda_graphs),
                                               "--replica-token-file", str(token_file),
                                               # where replicas keep the int8/uint8 calibration
                                               *(("--cache-dir", str(args.cache_dir))
                                                 if args.cache_dir else ())),
                                   env=replica_env(args.replicas, args.device))
    stop = asyncio.Event()
    with stop_on_signals(stop.set):
        try:
            if not await first_or_stop(asyncio.ensure_future(supervisor.start()), stop):
                return 0
            settings = gateway_settings(args, model_dir, supervisor.addresses, read_token_file(token_file))
            return await serve_http(settings, stop)
        finally:
            await supervisor.stop()
            log.info("stopped")
