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
import threading
from collections.abc import Callable, Coroutine
from dataclasses import replace
from pathlib import Path
from typing import Any

from embedserve.defaults.model_args import ModelSpec, default_cache_dir, model_specs_from_args
from embedserve.entrypoint import StartupError, configure_logging, run_event_loop, stop_on_signals
from embedserve.gateway.cli import add_gateway_flags, gateway_settings, serve_http, served_models
from embedserve.launch.commands import replica_env
from embedserve.launch.preflight import check_cache_dir, check_model_dir, check_port_free
from embedserve.launch.processes import first_or_stop
from embedserve.launch.supervisor import ReplicaSupervisor, SupervisorGroup
from embedserve.link.token_file import read_token_file, temporary_token_file
from embedserve.scheduler.cli import add_engine_flags, add_priority_flags, cuda_flags, engine_flags, priority_flags
from embedserve.tracing import otlp_endpoint_args

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
        raise StartupError(f"--replicas {args.replicas}: must be at least 1",
                           "start one replica or more (--replicas 1)")
    if args.calibration:   # the replicas write int8/uint8 calibration ranges there
        check_cache_dir(args.cache_dir or default_cache_dir())
    specs = model_specs_from_args(args)
    for spec in specs:
        if spec.upstream is not None:
            raise StartupError(f"--model {spec.format()}: serve starts each model's replicas "
                               "itself", "drop :upstream= (it is for embedserve gateway)")
    # Everything that can be known without a replica is checked before any starts.
    served_models(args, specs, [()] * len(specs))
    for spec in specs:
        assert spec.path is not None
        check_model_dir(spec.path)
    check_port_free(args.host, args.port)
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
             "--replica-token-file", str(token_file), *otlp_endpoint_args(args),
             # each replica's Prometheus endpoint, merged into the gateway's /metrics
             "--metrics-port", "0",
             # where replicas keep the int8/uint8 calibration
             *(("--cache-dir", str(args.cache_dir)) if args.cache_dir else ()))
    group = SupervisorGroup([
        ReplicaSupervisor(spec.model_dir, count, args.device, extra_args=extra, env=env,
                          label=_label(spec, len(specs)),
                          unix_socket_dir=None if socket_root is None else socket_root / str(k))
        for k, (spec, count) in enumerate(zip(specs, counts))])
    stop = asyncio.Event()
    with stop_on_signals(stop.set):
        try:
            # The gateway reads its models and warms their tokenizers while the replicas
            # start: both take seconds, mostly on one core each (docs/startup.md).
            preparing = _in_daemon_thread(_prepare_models, [spec.path for spec in specs])
            if not await first_or_stop(asyncio.ensure_future(_both(group.start(), preparing)), stop):
                return 0
            models = served_models(args, specs, [s.addresses for s in group.supervisors])
            settings = replace(gateway_settings(args, models, read_token_file(token_file)),
                               replica_metrics_urls=tuple(url for s in group.supervisors
                                                          for url in s.metrics_urls))
            status = await serve_http(settings, stop, preparing.result())
            log.info("stopped")
            return status
        finally:
            await group.stop()


async def _both(starting: Coroutine[Any, Any, Any], preparing: asyncio.Future) -> None:
    """Await both; when one fails, the other is cancelled (and awaited) before the error
    propagates, so no replica goes on starting behind a failed gateway."""
    started = asyncio.ensure_future(starting)
    try:
        await asyncio.gather(started, preparing)
    except BaseException:
        for pending in (started, preparing):
            pending.cancel()
        await asyncio.gather(started, preparing, return_exceptions=True)
        raise


def _prepare_models(model_dirs: list[Path]) -> dict:
    from embedserve.gateway.startup import prepare_models  # the gateway's imports, on this thread too

    return prepare_models(model_dirs)


def _in_daemon_thread(fn: Callable[..., Any], *args: Any) -> asyncio.Future:
    """``fn(*args)`` on a daemon thread, as a future of this loop: a stop during start-up
    neither waits for it (a first start may compile tokenizer kernels for a minute) nor
    is kept from exiting by it."""
    loop = asyncio.get_running_loop()
    future: asyncio.Future = loop.create_future()

    def settle(result: Any, error: BaseException | None) -> None:
        if future.done():  # cancelled: nobody waits
            return
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(result)

    def run() -> None:
        try:
            result, error = fn(*args), None
        except BaseException as exc:  # noqa: BLE001 - handed to the awaiting task
            result, error = None, exc
        try:
            loop.call_soon_threadsafe(settle, result, error)
        except RuntimeError:  # the loop has closed: the process is exiting
            pass

    threading.Thread(target=run, name="prepare-models", daemon=True).start()
    return future


def _label(spec: ModelSpec, model_count: int) -> str:
    """How log lines name a model's replicas: by the model when there are several."""
    if model_count == 1:
        return ""
    assert spec.path is not None
    return (spec.served_names or (spec.path.name,))[0]
