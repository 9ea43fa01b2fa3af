"""Concurrent clients against several stacks, interleaved: texts/s and latency per stack.

``python -m bench concurrency_ab --clients 8 --words 12 --stack DIR --stack DIR2`` serves each
``--stack`` (a source tree, then ``VAR=VALUE`` words and serve flags, as ``bench overhead``
takes them) with ``embedserve serve``, then runs rounds: in each, every stack in turn gets
``--clients`` threads that send requests back to back for ``--seconds`` (each request
``--texts`` texts of ``--words`` words drawn from README.md with a fixed seed). The order of
the stacks alternates between rounds, so drift in the machine's speed falls on every
stack alike. Reports per stack the mean texts/s over the rounds (and the lowest and
highest round) and the p50/p99 of every request's latency.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import threading
import time
from pathlib import Path

import numpy as np

from bench.overhead_bench import RawClient, Stack, add_stack_arguments, stack_arguments

ROOT = Path(__file__).resolve().parent.parent


def request_bodies(words: int, texts: int, count: int = 64, seed: int = 0) -> list[bytes]:
    """``count`` request bodies of ``texts`` texts, each ``words`` words of README.md."""
    vocabulary = (ROOT / "README.md").read_text().split()
    rng = random.Random(seed)
    return [json.dumps({"input": [" ".join(rng.choice(vocabulary) for _ in range(words))
                                  for _ in range(texts)]}).encode() for _ in range(count)]


def run_round(url: str, bodies: list[bytes], clients: int, seconds: float) -> tuple[int, float, list[float]]:
    """(requests answered, wall seconds, each request's latency in ms) of one round."""
    latencies: list[float] = []
    failures: list[str] = []
    stop_at = time.monotonic() + seconds

    def client(offset: int) -> None:
        connection = RawClient(url)
        try:
            k = offset
            while time.monotonic() < stop_at:
                started = time.perf_counter()
                status, _ = connection.request("POST", "/v1/embeddings", bodies[k % len(bodies)])
                if status != 200:
                    failures.append(f"{url}/v1/embeddings answered {status}")
                    return
                latencies.append((time.perf_counter() - started) * 1e3)
                k += clients
        finally:
            connection.close()

    threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
    started = time.monotonic()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if failures:
        raise RuntimeError(failures[0])
    return len(latencies), time.monotonic() - started, latencies


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench concurrency_ab",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=8, help="concurrent clients")
    parser.add_argument("--seconds", type=float, default=15.0, help="length of one stack's round")
    parser.add_argument("--rounds", type=int, default=4, help="measured rounds per stack")
    parser.add_argument("--words", type=int, default=12, help="words per text")
    parser.add_argument("--texts", type=int, default=1, help="texts per request")
    add_stack_arguments(parser)
    args = parser.parse_args(argv)
    specs, serve_flags = stack_arguments(args)
    bodies = request_bodies(args.words, args.texts)
    load_before = os.getloadavg()
    stacks: list[Stack] = []
    rates: dict[str, list[float]] = {}
    latencies: dict[str, list[float]] = {}
    try:
        for spec in specs:
            stacks.append(Stack(spec, serve_flags))
        for stack in stacks:
            stack.wait_ready()
            run_round(stack.url, bodies, args.clients, min(3.0, args.seconds))   # warm-up
            rates[stack.label], latencies[stack.label] = [], []
        for round_index in range(args.rounds):
            for stack in stacks if round_index % 2 == 0 else stacks[::-1]:
                answered, wall, round_latencies = run_round(stack.url, bodies, args.clients, args.seconds)
                rates[stack.label].append(answered * args.texts / wall)
                latencies[stack.label] += round_latencies
    finally:
        for stack in stacks:
            stack.close()
    load_after = os.getloadavg()
    print(f"concurrency A/B: {args.clients} clients, {args.texts} x {args.words}-word texts per "
          f"request, {args.rounds} rounds of {args.seconds:g} s per stack, serve "
          f"{' '.join(serve_flags) or '(defaults)'}; load average {load_before[0]:.2f} before, "
          f"{load_after[0]:.2f} after")
    print(f"{'stack':<44}{'texts/s':>9}{'min':>8}{'max':>8}{'p50 ms':>10}{'p99 ms':>10}")
    for stack in stacks:
        rate = np.array(rates[stack.label])
        p50, p99 = np.percentile(latencies[stack.label], [50, 99])
        print(f"{stack.label:<44}{rate.mean():>9.1f}{rate.min():>8.1f}{rate.max():>8.1f}"
              f"{p50:>10.1f}{p99:>10.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
