"""Scheduler benchmark: gRPC overhead, batching gain, batch and queue-time distributions.

Runs ``embedserve scheduler`` as a real subprocess on the default model
(CPU) and measures, against references taken in the same run:

(a) overhead: p50 of a batch-1 128-token Embed call minus p50 of
    ``Engine.step`` on the same input, interleaved so background load hits
    both alike. The server for (a) runs in this process on the same engine
    (its own event-loop thread, a real gRPC client over loopback): two
    processes would each keep their own OpenMP threads spinning between
    steps, which on 2 cores costs more than what is being measured.
    Target <= 1 ms.
(b) batching gain, against the scheduler as a separate process
    (``embedserve scheduler``): 16 concurrent calls of ~32 tokens each vs
    the same 16 calls one at a time, as throughput. Target >= 3x.
(c) under that load: batch sizes (from the server's Prometheus histogram)
    and per-call queue times (from the responses' timings).
(d) the CPU token budget: Engine.step tokens/s for batches of 32-token
    sequences at growing token counts (how the CPU default was chosen), and
    of 512-token sequences, one to eight per step.

    .venv/bin/python bench/scheduler_bench.py [--rounds 8] [--in-flight 2]
        [--dtype float32|bfloat16|auto] [--sweep-only]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import grpc
import numpy as np

from embedserve import ragged
from embedserve.defaults.build import ensure_default_model
from embedserve.defaults.model_args import default_cache_dir
from embedserve.engine import Batch, Engine
from embedserve.entrypoint import SCHEDULER_LISTENING
from embedserve.link import wire
from embedserve.protos import inference_pb2, inference_pb2_grpc
from embedserve.scheduler import SchedulerSettings, create_server

CLIENTS = 16


def sequence(rng: np.random.Generator, length: int) -> np.ndarray:
    """<s> random ids </s>: the engine's cost does not depend on which ids."""
    return np.concatenate([[0], rng.integers(5, 250_000, length - 2), [2]]).astype(np.int32)


def request(sequences: list[np.ndarray]) -> inference_pb2.EmbedRequest:
    packed = wire.pack_tokens(ragged.from_sequences(sequences))
    return inference_pb2.EmbedRequest(tokens=packed, normalize=True)


def start_scheduler(model_dir: Path, args: argparse.Namespace) -> tuple[subprocess.Popen, int, int]:
    command = [sys.executable, "-m", "embedserve.cli", "scheduler", "--model", str(model_dir),
               "--port", "0", "--metrics-port", "0", "--in-flight", str(args.in_flight)]
    if args.max_batch_tokens:
        command += ["--max-batch-tokens", str(args.max_batch_tokens)]
    if args.dtype:
        command += ["--dtype", args.dtype]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
    match = SCHEDULER_LISTENING.search(process.stdout.readline())
    if not match:
        process.kill()
        raise SystemExit("the scheduler did not start")
    return process, *(int(address.rsplit(":", 1)[1]) for address in match.groups())


def histogram(metrics_port: int, name: str) -> dict[str, float]:
    text = urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics").read().decode()
    return {m.group(1): float(m.group(2))
            for m in re.finditer(rf'^{name}_bucket{{le="([^"]+)"}} (\S+)$', text, re.MULTILINE)}


def p50(values: list[float]) -> float:
    return float(np.percentile(values, 50))


def in_process_stub(engine: Engine, model_dir: Path):
    """A scheduler on its own event-loop thread around ``engine``; returns (stub, close)."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    settings = SchedulerSettings(model_dir=model_dir)
    server, port = asyncio.run_coroutine_threadsafe(create_server(settings, engine), loop).result()
    channel = grpc.insecure_channel(f"127.0.0.1:{port}")

    def close() -> None:
        channel.close()
        asyncio.run_coroutine_threadsafe(server.stop(), loop).result()
        loop.call_soon_threadsafe(loop.stop)
        thread.join()

    return inference_pb2_grpc.InferenceStub(channel), close


def overhead(stub, engine: Engine, rng: np.random.Generator, iterations: int) -> None:
    seq = sequence(rng, 128)
    batch = Batch.from_sequences([seq])
    message = request([seq])
    for _ in range(3):  # warm both paths
        engine.step(batch).wait()
        stub.Embed(message)
    step_ms, call_ms, server_ms = [], [], []
    for _ in range(iterations):
        t0 = time.perf_counter()
        engine.step(batch).wait()
        t1 = time.perf_counter()
        response = stub.Embed(message)
        t2 = time.perf_counter()
        step_ms.append((t1 - t0) * 1e3)
        call_ms.append((t2 - t1) * 1e3)
        server_ms.append((response.timings.total_us - response.timings.compute_us) / 1e3)
    print(f"\n(a) batch-1 128-token Embed, {iterations} interleaved iterations")
    print("| measure | p50 ms |\n|---|---|")
    print(f"| Engine.step in-process | {p50(step_ms):.2f} |")
    print(f"| Embed over gRPC (client wall) | {p50(call_ms):.2f} |")
    print(f"| **overhead** (difference of p50s) | **{p50(call_ms) - p50(step_ms):.2f}** |")
    print(f"| server-side non-compute time (total_us - compute_us) | {p50(server_ms):.2f} |")


def batching_gain(stub, engine: Engine, metrics_port: int, rng: np.random.Generator,
                  rounds: int) -> None:
    sequential_s = concurrent_s = engine_one_s = engine_all_s = 0.0
    queue_us: list[int] = []
    concurrent_hist = {k: 0.0 for k in histogram(metrics_port, "embedserve_scheduler_batch_sequences")}
    for _ in range(rounds):
        calls = [request([sequence(rng, int(rng.integers(24, 41)))]) for _ in range(CLIENTS)]
        t0 = time.perf_counter()
        for message in calls:
            stub.Embed(message)
        t1 = time.perf_counter()
        start = histogram(metrics_port, "embedserve_scheduler_batch_sequences")
        t2 = time.perf_counter()
        futures = [stub.Embed.future(message) for message in calls]
        responses = [f.result() for f in futures]
        t3 = time.perf_counter()
        end = histogram(metrics_port, "embedserve_scheduler_batch_sequences")
        for key in concurrent_hist:
            concurrent_hist[key] += end[key] - start[key]
        queue_us.extend(r.timings.queue_us for r in responses)
        sequential_s += t1 - t0
        concurrent_s += t3 - t2
        # The engine alone on the same sequences: one step each vs one step for all.
        sequences = [wire.unpack_tokens(m.tokens).token_ids for m in calls]
        t4 = time.perf_counter()
        for seq in sequences:
            engine.step(Batch.from_sequences([seq])).wait()
        t5 = time.perf_counter()
        engine.step(Batch.from_sequences(sequences)).wait()
        t6 = time.perf_counter()
        engine_one_s += t5 - t4
        engine_all_s += t6 - t5
    n = rounds * CLIENTS
    print(f"\n(b) {CLIENTS} calls of 24-40 tokens, {rounds} rounds")
    print("| mode | calls/s |\n|---|---|")
    print(f"| one at a time | {n / sequential_s:.1f} |")
    print(f"| {CLIENTS} concurrent | {n / concurrent_s:.1f} |")
    print(f"| **gain** | **{sequential_s / concurrent_s:.2f}x** |")
    print(f"| engine alone, one step per call vs one step of {CLIENTS} (the most batching "
          f"can give) | {engine_one_s / engine_all_s:.2f}x |")
    print("\n(c) under the concurrent load: engine steps by batch size (sequences)")
    print("| batch size <= | steps |\n|---|---|")
    previous = 0.0
    for key, count in concurrent_hist.items():
        if count - previous:
            print(f"| {key} | {int(count - previous)} |")
        previous = count
    q = np.array(queue_us) / 1e3
    print(f"\nqueue time per call (arrival to first batched), ms: p50 {np.percentile(q, 50):.1f}, "
          f"p90 {np.percentile(q, 90):.1f}, p99 {np.percentile(q, 99):.1f}, max {q.max():.1f}")


def budget_sweep(engine: Engine, rng: np.random.Generator, repeats: int = 7) -> None:
    print(f"\n(d) Engine.step throughput by batch tokens, CPU, {engine.info.dtype}")
    print("| sequence tokens | batch tokens | sequences | step min ms | tokens/s |\n|---|---|---|---|---|")
    shapes = [(32, n) for n in (64, 128, 256, 512, 1024, 2048)] + [(512, n) for n in (512, 1024, 2048, 4096)]
    batches = {shape: Batch.from_sequences([sequence(rng, shape[0]) for _ in range(shape[1] // shape[0])])
               for shape in shapes}
    best = {shape: float("inf") for shape in shapes}
    for shape in shapes:
        engine.step(batches[shape]).wait()
    # Round-robin over sizes, best of several: other processes on a shared
    # machine then slow every size alike instead of whichever ran during a burst.
    for _ in range(repeats):
        for shape in shapes:
            t0 = time.perf_counter()
            engine.step(batches[shape]).wait()
            best[shape] = min(best[shape], time.perf_counter() - t0)
    for length, tokens in shapes:
        seconds = best[length, tokens]
        print(f"| {length} | {tokens} | {tokens // length} | {seconds * 1e3:.1f} | {tokens / seconds:.0f} |")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, default=None, help="default: the default model")
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--iterations", type=int, default=50)
    parser.add_argument("--in-flight", type=int, default=2)
    parser.add_argument("--max-batch-tokens", type=int, default=None)
    parser.add_argument("--skip-sweep", action="store_true")
    parser.add_argument("--sweep-only", action="store_true", help="only (d), the token budget sweep")
    parser.add_argument("--dtype", default=None,
                        help="the engine's dtype, in this process and the scheduler's (default: float32 here, "
                             "the scheduler's own default there)")
    args = parser.parse_args(argv)
    model_dir = args.model or ensure_default_model(default_cache_dir())
    engine = Engine.load(model_dir, dtype=args.dtype)
    rng = np.random.default_rng(0)
    if args.sweep_only:
        print(f"{os.cpu_count()} CPUs, load average before {os.getloadavg()[0]:.1f}")
        budget_sweep(engine, rng)
        engine.close()
        print(f"\nload average after {os.getloadavg()[0]:.1f}")
        return 0
    print(f"{os.cpu_count()} CPUs, load average before {os.getloadavg()[0]:.1f} "
          "(other processes on the machine slow thread hand-offs, which (a) measures)")
    stub, close = in_process_stub(engine, model_dir)
    try:
        overhead(stub, engine, rng, args.iterations)
    finally:
        close()
    process, port, metrics_port = start_scheduler(model_dir, args)
    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = inference_pb2_grpc.InferenceStub(channel)
            info = stub.Info(inference_pb2.InfoRequest())
            print(f"\nscheduler process: model {info.model_id}, device {info.device}, "
                  f"max_batch_tokens {info.max_batch_tokens}, in-flight {args.in_flight}")
            batching_gain(stub, engine, metrics_port, rng, args.rounds)
        if not args.skip_sweep:
            budget_sweep(engine, rng)
    finally:
        process.terminate()
        process.wait(60)
        engine.close()
    print(f"\nload average after {os.getloadavg()[0]:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
