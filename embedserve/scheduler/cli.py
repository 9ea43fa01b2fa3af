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
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from embedserve.defaults.model_args import add_model_arguments, default_cache_dir, model_dir_from_args
from embedserve.entrypoint import configure_logging, run_event_loop, scheduler_banner, stop_on_signals
from embedserve.link.token_file import add_replica_token_argument, replica_token_from_args
from embedserve.model.cuda_options import ATTENTION_CHOICES
from embedserve.model.probe_texts import DEFAULT_PROBE_MIN_COSINE
from embedserve.scheduler.settings import (
    BATCH_TOKENS_WHILE_INTERACTIVE,
    DEFAULT_DTYPE,
    INTERACTIVE_WINDOW_S,
    PREEMPT_BATCH_STEPS,
    REPLICA_DTYPES,
    REPLICA_LANE_NICE,
    REPLICA_SMALL_STEP_THREADS,
    SchedulerSettings,
    default_max_batch_tokens,
)
from embedserve.tracing import add_otlp_endpoint_flag, tracing_settings

# The exit status of a replica whose device failed for good (a poisoned CUDA context).
EXIT_DEVICE_LOST = 3
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
    parser.add_argument("--unix-socket", type=Path, default=None, metavar="PATH",
                        help="also serve gRPC on this Unix domain socket, for a gateway on the "
                             "same machine (no TCP loopback per call); --port stays open "
                             "(default: none)")
    parser.add_argument("--frame-port", type=_port_or_off, default=_FRAME_PORT_UNSET, metavar="PORT|off",
                        help="TCP port of the frame socket: Embed/Score calls for about a "
                             "millisecond less than gRPC; a gateway learns it from Info and "
                             "falls back to gRPC when it cannot connect. 0 picks a free one "
                             "(default: 0; off with --unix-socket, whose frames go over the "
                             "socket beside it)")
    parser.add_argument("--max-frame-connections", type=_positive, default=64, metavar="N",
                        help="frame connections open at once (a gateway holds one per replica); "
                             "beyond it a connection is closed at once (default: %(default)s)")
    parser.add_argument("--metrics-port", type=int, default=None,
                        help="Prometheus /metrics port; 0 picks a free one (default: none)")
    add_engine_flags(parser)
    parser.add_argument("--max-batch-tokens", type=_positive, default=None,
                        help="token budget per engine step; larger batches amortize per-step "
                             "cost but make each step (and a short query behind it) slower "
                             "(default, by measurement: 512 on CUDA and on CPU in float32, 1024 on CPU "
                             "in bfloat16)")
    parser.add_argument("--max-batch-sequences", type=_positive, default=256,
                        help="most sequences per step (default: %(default)s)")
    parser.add_argument("--max-queue-tokens", type=_positive, default=65536,
                        help="tokens allowed to wait for a batch; beyond it calls get "
                             "RESOURCE_EXHAUSTED at once. Bounds memory and queueing delay "
                             "(default: %(default)s)")
    parser.add_argument("--in-flight", type=_positive, default=2,
                        help="engine steps submitted at once: 2 forms the next batch while "
                             "one runs; more only adds queueing (default: %(default)s)")
    parser.add_argument("--drain-timeout", type=float, default=25.0,
                        help="seconds to let calls finish after SIGTERM (default: %(default)s)")
    add_priority_flags(parser)
    parser.add_argument("--calibrate-only", action="store_true",
                        help="compute (or find) the calibration in --cache-dir, print its "
                             "directory and exit without serving: bakes it into an image so "
                             "every container quantizes with the same ranges")
    add_replica_token_argument(parser, "refuse calls (UNAUTHENTICATED) that do not carry the "
                                       "token in this file as 'authorization: Bearer TOKEN'; "
                                       "health checks stay open")
    add_otlp_endpoint_flag(parser)
    parser.set_defaults(func=run)


def add_engine_flags(parser: argparse.ArgumentParser) -> None:
    """``--device``, ``--dtype``, ``--dtype-probe-min-cosine``, ``--cuda-graphs``,
    ``--calibration``: declared once for the scheduler and the launchers that pass them on
    to their replicas (``engine_flags`` writes them back)."""
    parser.add_argument("--device", default="cpu", help="cpu or cuda[:N] (default: %(default)s)")
    add_dtype_flags(parser)
    parser.add_argument("--cuda-graphs", action=argparse.BooleanOptionalAction, default=True,
                        help="CUDA only: capture a graph per (token, sequence) bucket and replay "
                             "it, cutting per-step launch overhead at the cost of capture time "
                             "and graph memory; --no-cuda-graphs runs eagerly (default: on)")
    add_cuda_flags(parser)
    parser.add_argument("--calibration", action=argparse.BooleanOptionalAction, default=True,
                        help="int8/uint8 embeddings: read the model's calibration ranges from "
                             "--cache-dir, or compute them once at start-up (the model embeds "
                             "a fixed text sample: seconds, once per model and dtype) and store "
                             "them there for every later start and every replica sharing the "
                             "directory; --no-calibration skips it (a faster first start) and "
                             "refuses int8/uint8; float and binary are served either way "
                             "(default: on)")


def add_cuda_flags(parser: argparse.ArgumentParser) -> None:
    """The CUDA runner's attention kernel and graph-cache flags (``cuda_flags`` writes
    them back)."""
    parser.add_argument("--cuda-attention", default="auto", choices=ATTENTION_CHOICES,
                        help="CUDA only: varlen runs one fused FlashAttention call over the "
                             "packed sequences (cost: each sequence's own length squared; "
                             "bfloat16 and float16); padded runs one masked attention over a "
                             "bucket's tokens; auto: varlen where it covers the dtype "
                             "(default: %(default)s)")
    parser.add_argument("--max-graphs", type=_positive, default=None, metavar="N",
                        help="CUDA only: the most graphs kept, least recently used evicted "
                             "first (default: one per bucket a step can take, so none is "
                             "evicted)")
    parser.add_argument("--graph-memory", type=_positive, default=None, metavar="MIB",
                        help="CUDA only: the most device memory the graphs may hold, as each "
                             "capture measured it; a graph larger than this alone runs "
                             "eagerly (default: no cap)")
    parser.add_argument("--capture-at-start", action=argparse.BooleanOptionalAction,
                        default=False,
                        help="CUDA only: capture every bucket's graph before reporting SERVING "
                             "(seconds at start, none later); default: capture a bucket on "
                             "its second step")


def add_priority_flags(parser: argparse.ArgumentParser) -> None:
    """The replica's priority-class flags (docs/priority.md); ``serve`` passes them on."""
    parser.add_argument("--preempt-batch-steps", action=argparse.BooleanOptionalAction,
                        default=PREEMPT_BATCH_STEPS,
                        help="CPU only: an interactive step runs between two layers of the "
                             "batch step being computed, which then resumes, so a query waits "
                             "for one layer, and batch steps keep the full --max-batch-tokens "
                             "(--batch-tokens-while-interactive and --interactive-window do not "
                             "apply). --no-preempt-batch-steps: the classes share steps, bounded "
                             "by those two flags, as on CUDA always (default: on)")
    parser.add_argument("--cpu-lanes", type=_positive, default=None, metavar="N",
                        help="CPU only: up to N batch steps computed side by side, a thread "
                             "each, the cores split between them (a step alone gets them all), "
                             "and each interactive step started at once on a thread of its own, "
                             "ahead of them in CPU priority. 1: one step at a time on every "
                             "core, interactive steps between two layers of the batch step "
                             "(default: 2 where the replica has 2 threads or more, else 1)")
    parser.add_argument("--batch-tokens-while-interactive", type=_positive,
                        default=BATCH_TOKENS_WHILE_INTERACTIVE, metavar="N",
                        help="without preemption: while interactive calls are queued or "
                             "arrived within --interactive-window, a step carries at most N batch-class tokens "
                             "(and always one batch sequence): smaller keeps an interactive "
                             "query's wait behind a step shorter, larger keeps more of a bulk "
                             "job's tokens/s (default, by measurement: %(default)s)")
    parser.add_argument("--interactive-window", type=_non_negative_float,
                        default=INTERACTIVE_WINDOW_S, metavar="SECONDS",
                        help="without preemption: how long after an interactive call arrives "
                             "steps stay bounded for the next one, which then waits behind a "
                             "smaller step; costs a bulk job tokens/s all that time. 0: bounded only while one is "
                             "queued (default: %(default)s)")


def priority_flags(args: argparse.Namespace) -> tuple[str, ...]:
    """The flags of ``add_priority_flags`` in ``args`` that differ from their defaults."""
    return (*(("--batch-tokens-while-interactive", str(args.batch_tokens_while_interactive))
              if args.batch_tokens_while_interactive != BATCH_TOKENS_WHILE_INTERACTIVE else ()),
            *(("--interactive-window", repr(args.interactive_window))
              if args.interactive_window != INTERACTIVE_WINDOW_S else ()),
            *(("--no-preempt-batch-steps",) if args.preempt_batch_steps != PREEMPT_BATCH_STEPS else ()),
            *(("--cpu-lanes", str(args.cpu_lanes)) if args.cpu_lanes is not None else ()))


def _non_negative_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be >= 0")
    return value


def cuda_flags(args: argparse.Namespace) -> tuple[str, ...]:
    """The flags of ``add_cuda_flags`` in ``args`` that differ from their defaults."""
    return (*(("--cuda-attention", args.cuda_attention) if args.cuda_attention != "auto" else ()),
            *(("--max-graphs", str(args.max_graphs)) if args.max_graphs is not None else ()),
            *(("--graph-memory", str(args.graph_memory)) if args.graph_memory is not None else ()),
            *(("--capture-at-start",) if args.capture_at_start else ()))


Number = TypeVar("Number", int, float)


def _number_within(text: str, kind: Callable[[str], Number], what: str, low: Number,
                   high: Number | None) -> Number:
    """``text`` as a ``kind`` in [low, high] (argparse type: a bad value is a usage error
    at every entry point)."""
    try:
        value = kind(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not {what}: {text!r}") from None
    if high is None and value < low:
        raise argparse.ArgumentTypeError(f"must be at least {low}, got {text}")
    if high is not None and not low <= value <= high:
        raise argparse.ArgumentTypeError(f"must be between {low} and {high}, got {text}")
    return value


def _positive(text: str) -> int:
    """A whole number >= 1 (argparse type)."""
    return _number_within(text, int, "a whole number", 1, None)


def add_dtype_flags(parser: argparse.ArgumentParser) -> None:
    """``--dtype`` and ``--dtype-probe-min-cosine``: the replicas' and the bulk command's."""
    parser.add_argument("--dtype", default=DEFAULT_DTYPE, choices=REPLICA_DTYPES,
                        help="engine compute dtype. auto: bfloat16 on CUDA and on a CPU with "
                             "native bf16 (AMX or AVX512-BF16), float32 elsewhere; a reduced "
                             "precision is kept only if a load-time probe (a few fixed texts "
                             "embedded in it and in float32) agrees with float32, else float32 "
                             "(/info's dtype_reason says which and why). int8 (CPU only): "
                             "int8 weights and activations in the encoder layers' linears "
                             "(AMX-INT8 / VNNI where the CPU has them), never picked by auto "
                             "(default: %(default)s)")
    parser.add_argument("--dtype-probe-min-cosine", type=_cosine, default=DEFAULT_PROBE_MIN_COSINE,
                        metavar="C",
                        help="--dtype auto's bar: the smallest cosine between a probe text's "
                             "vector in bfloat16 and in float32 (cross-encoders: scores may move "
                             "by sqrt(2(1-C)) after the sigmoid); 1 forces float32 "
                             "(default: %(default)s)")


# --frame-port not given: a free port, or none for a replica given --unix-socket (its
# gateway is on this machine; a TCP frame port would be one more door nobody uses).
_FRAME_PORT_UNSET = -1


def _port_or_off(text: str) -> int | None:
    """A TCP port (0: any free one), or "off" for None (argparse type)."""
    return None if text == "off" else _number_within(text, int, "a port or 'off'", 0, 65535)


def _cosine(text: str) -> float:
    """A cosine bar in [0, 1] (argparse type)."""
    return _number_within(text, float, "a number", 0, 1)  # type: ignore[arg-type]  # int bounds, float value


def engine_flags(dtype: str | None, cuda_graphs: bool = True,
                 probe_min_cosine: float = DEFAULT_PROBE_MIN_COSINE,
                 calibration: bool = True) -> tuple[str, ...]:
    """The scheduler flags for ``dtype``, the probe's bar, ``cuda_graphs`` and
    ``calibration``; empty for the defaults."""
    return (*(("--dtype", dtype) if dtype not in (None, DEFAULT_DTYPE) else ()),
            *(("--dtype-probe-min-cosine", repr(probe_min_cosine))
              if probe_min_cosine != DEFAULT_PROBE_MIN_COSINE else ()),
            *(() if cuda_graphs else ("--no-cuda-graphs",)),
            *(() if calibration else ("--no-calibration",)))


def settings_from_args(args: argparse.Namespace, model_dir: Path) -> SchedulerSettings:
    return SchedulerSettings(
        model_dir=model_dir, host=args.host, port=args.port, unix_socket=args.unix_socket,
        frame_port=(args.frame_port if args.frame_port != _FRAME_PORT_UNSET
                    else None if args.unix_socket is not None else 0),
        max_frame_connections=args.max_frame_connections,
        metrics_port=args.metrics_port,
        device=args.device, dtype=args.dtype, dtype_probe_min_cosine=args.dtype_probe_min_cosine,
        cuda_graphs=args.cuda_graphs, cuda_attention=args.cuda_attention,
        max_graphs=args.max_graphs, graph_memory_mib=args.graph_memory,
        capture_at_start=args.capture_at_start,
        max_batch_tokens=args.max_batch_tokens,
        max_batch_sequences=args.max_batch_sequences, max_queue_tokens=args.max_queue_tokens,
        in_flight_depth=args.in_flight, drain_timeout_s=args.drain_timeout,
        batch_tokens_while_interactive=args.batch_tokens_while_interactive,
        interactive_window_s=args.interactive_window, preempt_batch_steps=args.preempt_batch_steps,
        cpu_lanes=args.cpu_lanes,
        calibration_cache_dir=(args.cache_dir or default_cache_dir()) if args.calibration else None,
        replica_token=replica_token_from_args(args, os.environ),
        tracing=tracing_settings(args.otlp_endpoint, os.environ, "embedserve-replica"))


def run(args: argparse.Namespace) -> int:
    configure_logging()
    settings = settings_from_args(args, model_dir_from_args(args))
    if args.calibrate_only:
        return calibrate_only(settings)
    return run_event_loop(serve(settings))


def calibrate_only(settings: SchedulerSettings) -> int:
    """What a replica does at start-up about its calibration, without serving. The batches
    are the replica's (same token budget), so the vectors are the ones it would compute."""
    from embedserve import calibration
    from embedserve.engine.batch import Batch
    from embedserve.scheduler.engine_loading import load_engine

    if settings.calibration_cache_dir is None:
        print("embedserve scheduler: --calibrate-only needs calibration (drop --no-calibration)",
              file=sys.stderr)
        return 2
    with load_engine(settings.model_dir, settings.device, settings.dtype,
                     probe_min_cosine=settings.dtype_probe_min_cosine,
                     cuda_graphs=settings.cuda_graphs, cuda=settings.cuda_options()) as engine:
        if engine.info.task != "embed":
            print("embedserve scheduler: a scorer has no calibration", file=sys.stderr)
            return 0
        directory = calibration.calibration_dir(settings.calibration_cache_dir,
                                                settings.model_dir, engine.info.dtype or "")
        calibration.load_or_calibrate(directory, settings.model_dir, engine.info,
                                      lambda tokens: engine.step(Batch.of(tokens)).wait(),
                                      settings.max_batch_tokens
                                      or default_max_batch_tokens(settings.device, engine.info.dtype),
                                      settings.max_batch_sequences)
    print(directory, flush=True)
    return 0


async def serve(settings: SchedulerSettings) -> int:
    """Load the engine, serve until SIGTERM/SIGINT, drain, close."""
    from embedserve.scheduler.engine_loading import load_engine
    from embedserve.scheduler.server import create_server

    engine = await asyncio.to_thread(load_engine, settings.model_dir, settings.device,
                                     settings.dtype, probe_min_cosine=settings.dtype_probe_min_cosine,
                                     cuda_graphs=settings.cuda_graphs, cuda=settings.cuda_options(),
                                     cpu_lanes=settings.cpu_lanes, cpu_lane_nice=REPLICA_LANE_NICE,
                                     small_step_threads=REPLICA_SMALL_STEP_THREADS)
    try:
        stop = asyncio.Event()
        server, port = await create_server(settings, engine, on_device_lost=stop.set)
        with stop_on_signals(stop.set):
            print(scheduler_banner(settings.host, port, server.metrics_port), flush=True)
            if server.service.frame_port:
                log.info("frame socket on %s:%d (Embed/Score for gateways that reach this "
                         "replica's address)", settings.host, server.service.frame_port)
            await stop.wait()
            log.info("%s: draining (%d calls active)",
                     "device lost" if server.device_lost else "signal received",
                     server.service.active_calls)
            await server.stop()
        log.info("stopped")
    finally:
        engine.close()
    # Non-zero: a supervisor (embedserve serve, Kubernetes) starts a fresh process.
    return EXIT_DEVICE_LOST if server.device_lost else 0
