"""``embedserve scheduler``: run one scheduler replica (gRPC) around a local engine.

The entry point: flags -> ``SchedulerSettings``, load the engine, serve until
SIGTERM or SIGINT, then drain (health NOT_SERVING, new calls UNAVAILABLE,
calls in flight finish) and exit 0. Once ready it prints one line,
``embedserve scheduler listening on HOST:PORT metrics HOST:PORT``, which is
how a parent process learns the ports when it passed 0.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
from pathlib import Path

from embedserve.defaults.model_args import add_model_arguments, model_dir_from_args
from embedserve.scheduler.settings import (REPLICA_DTYPES, SchedulerSettings,
                                           default_max_batch_tokens)

log = logging.getLogger("embedserve.scheduler")

def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "scheduler", help="serve a model over gRPC with token-budget batching",
        description="Serve one model over gRPC with first-come-first-served token-budget "
                    "batching; SIGTERM drains.")
    add_model_arguments(parser, "Hugging Face model directory (default: multilingual-e5-small, "
                                "built on first use into --cache-dir)")
    parser.add_argument("--host", default="127.0.0.1",
                        help="address to bind (default: %(default)s)")
    parser.add_argument("--port", type=int, default=50051,
                        help="gRPC port; 0 picks a free one (default: %(default)s)")
    parser.add_argument("--metrics-port", type=int, default=None,
                        help="Prometheus /metrics port; 0 picks a free one (default: none)")
    parser.add_argument("--device", default="cpu", help="cpu or cuda[:N] (default: %(default)s)")
    parser.add_argument("--dtype", default=None, choices=REPLICA_DTYPES,
                        help="engine dtype (default: float32 on CPU, bfloat16 on CUDA)")
    parser.add_argument("--cuda-graphs", action=argparse.BooleanOptionalAction, default=True,
                        help="CUDA only: capture a graph per (token, sequence) bucket and replay "
                             "it, cutting per-step launch overhead at the cost of capture time "
                             "and graph memory; --no-cuda-graphs runs eagerly (default: on)")
    parser.add_argument("--max-batch-tokens", type=int, default=None,
                        help="token budget per engine step; larger batches amortize per-step "
                             "cost but make each step (and a short query behind it) slower "
                             "(default: 512 on CUDA and, by measurement, on CPU)")
    parser.add_argument("--max-batch-sequences", type=int, default=256,
                        help="most sequences per step (default: %(default)s)")
    parser.add_argument("--max-queue-tokens", type=int, default=65536,
                        help="tokens allowed to wait for a batch; beyond it calls get "
                             "RESOURCE_EXHAUSTED at once. Bounds memory and queueing delay "
                             "(default: %(default)s)")
    parser.add_argument("--in-flight", type=int, default=2,
                        help="engine steps submitted at once: 2 forms the next batch while "
                             "one runs; more only adds queueing (default: %(default)s)")
    parser.add_argument("--drain-timeout", type=float, default=25.0,
                        help="seconds to let calls finish after SIGTERM (default: %(default)s)")
    parser.set_defaults(func=run)


def settings_from_args(args: argparse.Namespace, model_dir: Path) -> SchedulerSettings:
    return SchedulerSettings(
        model_dir=model_dir, host=args.host, port=args.port, metrics_port=args.metrics_port,
        device=args.device, dtype=args.dtype, cuda_graphs=args.cuda_graphs,
        max_batch_tokens=args.max_batch_tokens or default_max_batch_tokens(args.device),
        max_batch_sequences=args.max_batch_sequences, max_queue_tokens=args.max_queue_tokens,
        in_flight_depth=args.in_flight, drain_timeout_s=args.drain_timeout)


def run(args: argparse.Namespace) -> int:
    logging.basicConfig(level=logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    settings = settings_from_args(args, model_dir_from_args(args))
    return asyncio.run(serve(settings))


async def serve(settings: SchedulerSettings) -> int:
    """Load the engine, serve until SIGTERM/SIGINT, drain, close."""
    from embedserve.engine import Engine
    from embedserve.scheduler.server import create_server

    engine = await asyncio.to_thread(Engine.load, settings.model_dir, settings.device,
                                     settings.dtype, cuda_graphs=settings.cuda_graphs)
    try:
        server, port = await create_server(settings, engine)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        metrics = f"{settings.host}:{server.metrics_port}" if server.metrics_port is not None \
            else "off"
        print(f"embedserve scheduler listening on {settings.host}:{port} metrics {metrics}",
              flush=True)
        await stop.wait()
        log.info("signal received: draining (%d calls active)", server.service.active_calls)
        await server.stop()
        log.info("stopped")
    finally:
        engine.close()
    return 0
