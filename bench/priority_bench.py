"""``python -m bench priority``: online queries while a bulk job runs through the same server.

Issue 46's check of the priority classes (docs/priority.md), on one default
``embedserve serve`` (flags after ``--serve-args`` are added to it):

0. warm-up (unmeasured): 20 queries, then a bulk job of ``WARM_DOCS`` documents;
1. **idle**: one interactive client sends a short query (``/v1/embeddings``, one
   text of a few words) every ``--interval-ms``, waiting for each answer, for
   ``--queries`` queries;
2. **bulk solo**: ``embedserve embed --url`` re-embeds ``--docs`` documents of the
   bulk benchmark's mixed corpus (``bench/bulk_corpus.py``) through the server
   (it sends them in the batch class; ``--serve-args "--route-priority
   /v1/embeddings=interactive"`` runs them as interactive: the first-come-first-served
   baseline);
3. **shared**: the same bulk job again, with the interactive client running all
   along; only the queries sent while the gateway held the bulk job's tokens count
   (its ``embedserve_gateway_inflight_tokens`` gauge, polled).

Reported: the interactive p50/p90/p99 idle and during the bulk job, and the bulk
job's tokens/s (its own summary: from its first request to its last answer) solo
and shared. The targets (issue 46): shared p99 <= 250 ms, shared p50 <= 1.5x idle
p50, shared bulk tokens/s >= 85 % of solo.
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

import numpy as np

from bench import bulk_corpus
from bench.bulk_bench import run_embed
from bench.reference_data import DEFAULT_DATA_DIR, MISSING_EXIT_STATUS, missing_line

ROOT = Path(__file__).resolve().parents[1]
WARM_DOCS = 300
QUERIES = ("how do I reset my password", "opening hours of the city library",
           "cheap flights to lisbon in may", "symptoms of vitamin d deficiency",
           "best way to learn python", "weather tomorrow in berlin")
# The gateway's tokens in flight, all classes: above a short query's few tokens, the bulk
# job is in flight (also when --route-priority runs it as interactive, the FCFS baseline).
INFLIGHT = re.compile(r'^embedserve_gateway_inflight_tokens\{[^}]*\} ([0-9.e+]+)$', re.MULTILINE)
BULK_INFLIGHT_TOKENS = 256


def log(message: str) -> None:
    print(f"[priority] {message}", file=sys.stderr, flush=True)


# Server-Timing phases (gateway/middleware.py), medians printed: where the time went.
# ``rpc`` minus ``replica`` is the hop to the replica and back, including the wait
# for the step the replica's loop is computing when the call arrives.
PHASES = ("parse", "tokenize", "dispatch", "rpc", "replica", "queue", "inference", "encode", "total")


def interactive_client(base_url: str, interval_s: float, stop: threading.Event,
                       max_queries: int | None) -> list[tuple[float, float, dict[str, float]]]:
    """(send time, latency s, Server-Timing phases in s) of each query: one every
    ``interval_s`` (or right after the previous answer when that came later), until
    ``stop`` or ``max_queries``."""
    import httpx

    results: list[tuple[float, float, dict[str, float]]] = []
    with httpx.Client(base_url=base_url, timeout=60.0) as client:
        next_at = time.monotonic()
        k = 0
        while not stop.is_set() and (max_queries is None or k < max_queries):
            delay = next_at - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            body = {"input": QUERIES[k % len(QUERIES)], "input_type": "query"}
            sent = time.monotonic()
            reply = client.post("/v1/embeddings", json=body)
            latency = time.monotonic() - sent
            if reply.status_code != 200:
                raise RuntimeError(f"interactive query answered {reply.status_code}: {reply.text[:200]}")
            results.append((sent, latency, server_timing(reply.headers.get("server-timing", ""))))
            next_at += interval_s
            k += 1
    return results


def server_timing(header: str) -> dict[str, float]:
    """``queue;dur=1.2, total;dur=3.4`` -> {"queue": 0.0012, "total": 0.0034}."""
    phases = {}
    for item in header.split(","):
        name, _, duration = item.strip().partition(";dur=")
        if duration:
            phases[name] = float(duration) / 1e3
    return phases


def batch_active_window(base_url: str, stop: threading.Event, window: list[float]) -> None:
    """Fill ``window`` with [first, last] monotonic time the gateway held the bulk job's tokens."""
    while not stop.is_set():
        try:
            with urllib.request.urlopen(f"{base_url}/metrics", timeout=5.0) as reply:
                text = reply.read().decode()
        except OSError:
            text = ""
        held = sum(float(v) for v in INFLIGHT.findall(text))
        now = time.monotonic()
        if held > BULK_INFLIGHT_TOKENS:
            if not window:
                window.extend((now, now))
            window[1] = now
        stop.wait(0.1)


def percentiles(results: list[tuple[float, float, dict[str, float]]]) -> dict[str, float]:
    values = np.asarray([latency for _, latency, _ in results]) * 1e3
    row = {"n": len(values), "p50": float(np.percentile(values, 50)),
           "p90": float(np.percentile(values, 90)), "p99": float(np.percentile(values, 99)),
           "max": float(values.max())}
    for phase in {name for _, _, t in results for name in t}:
        row[phase] = float(np.median([t.get(phase, 0.0) for _, _, t in results])) * 1e3
    return row


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench priority", description=__doc__.splitlines()[0])
    parser.add_argument("--docs", type=int, default=3000, help="bulk job documents (default: %(default)s)")
    parser.add_argument("--queries", type=int, default=200,
                        help="interactive queries in the idle run (default: %(default)s)")
    parser.add_argument("--interval-ms", type=float, default=50.0,
                        help="interactive client's period (default: %(default)s)")
    parser.add_argument("--serve-args", default="",
                        help="extra flags for embedserve serve, one string (default: none)")
    parser.add_argument("--data-dir", type=Path, default=DEFAULT_DATA_DIR)
    parser.add_argument("--work-dir", type=Path, default=Path.home() / ".cache" / "embedserve" / "bench",
                        help="server logs (default: %(default)s)")
    args = parser.parse_args(argv)
    missing = missing_line("python -m bench priority", [bulk_corpus.udhr_dir(args.data_dir)], "--data-dir")
    if missing:
        print(missing, file=sys.stderr)
        return MISSING_EXIT_STATUS

    from bench.suite.peer_process import running_server
    from bench.suite.systems import SERVE_READY_TIMEOUT_S, serve_command
    from embedserve.defaults.build import ensure_default_model
    from embedserve.defaults.model_args import default_cache_dir
    from embedserve.launch.processes import free_port

    model_dir = ensure_default_model(default_cache_dir())
    interval = args.interval_ms / 1e3
    port = free_port()
    base_url = f"http://127.0.0.1:{port}"
    command = [*serve_command(model_dir, port, "cpu", None), *shlex.split(args.serve_args)]
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    with tempfile.TemporaryDirectory(prefix="embedserve-priority-") as tmp:
        corpus = bulk_corpus.write_jsonl(Path(tmp) / "docs.jsonl", bulk_corpus.mixed(args.data_dir, args.docs))
        warm_corpus = bulk_corpus.write_jsonl(Path(tmp) / "warm.jsonl",
                                              bulk_corpus.mixed(args.data_dir, WARM_DOCS))
        output = Path(tmp) / "out.parquet"
        with running_server(command, name="embedserve serve", health_url=f"{base_url}/ready",
                            log_path=args.work_dir / "priority-serve.log", env=env,
                            ready_timeout_s=SERVE_READY_TIMEOUT_S, log=log):
            # Warm-up, unmeasured: the engine's first steps of each padded shape, the
            # bulk client's first tokenizer load.
            interactive_client(base_url, interval, threading.Event(), 20)
            run_embed(warm_corpus, output, model_dir, "--url", base_url)
            log(f"idle: {args.queries} queries, one every {args.interval_ms:.0f} ms")
            idle = percentiles(interactive_client(base_url, interval, threading.Event(), args.queries))
            log(f"bulk solo: {args.docs} documents")
            solo = run_embed(corpus, output, model_dir, "--url", base_url)
            log("shared: the bulk job again, the interactive client all along")
            stop, window, shared_runs = threading.Event(), [], {}
            watcher = threading.Thread(target=batch_active_window, args=(base_url, stop, window))
            bulk = threading.Thread(target=lambda: shared_runs.update(
                run_embed(corpus, output, model_dir, "--url", base_url)))
            watcher.start()
            bulk.start()
            client_results: list[tuple[float, float, dict[str, float]]] = []
            client = threading.Thread(target=lambda: client_results.extend(
                interactive_client(base_url, interval, stop, None)))
            client.start()
            bulk.join()
            stop.set()
            client.join()
            watcher.join()
    if not window or not shared_runs:
        log("the shared run saw no bulk tokens in flight: nothing measured")
        return 1
    during = [r for r in client_results if window[0] <= r[0] <= window[1]]
    shared = percentiles(during)
    solo_rate = solo["tokens"] / solo["seconds"]
    shared_rate = shared_runs["tokens"] / shared_runs["seconds"]
    print(f"\nembedserve serve {args.serve_args or '(defaults)'}; {args.docs} documents, "
          f"{solo['tokens']:,} tokens; one query every {args.interval_ms:.0f} ms\n")
    print("| interactive | queries | p50 ms | p90 ms | p99 ms | max ms |\n|---|---:|---:|---:|---:|---:|")
    for name, row in (("idle", idle), ("during bulk", shared)):
        print(f"| {name} | {row['n']} | {row['p50']:.1f} | {row['p90']:.1f} | {row['p99']:.1f} | "
              f"{row['max']:.1f} |")
    print("\nServer-Timing medians, ms (rpc - replica: the hop, and the wait for the step being "
          "computed when the call arrived):\n")
    print("| interactive | " + " | ".join(PHASES) + " |\n|---|" + "---:|" * len(PHASES))
    for name, row in (("idle", idle), ("during bulk", shared)):
        print(f"| {name} | " + " | ".join(f"{row.get(p, 0.0):.1f}" for p in PHASES) + " |")
    print("\n| bulk job | tokens/s | vs solo |\n|---|---:|---:|")
    print(f"| solo | {solo_rate:,.0f} | 1.00 |")
    print(f"| with the interactive client | {shared_rate:,.0f} | {shared_rate / solo_rate:.2f} |")
    checks = [("interactive p99 during bulk <= 250 ms", shared["p99"] <= 250.0),
              ("interactive p50 during bulk <= 1.5x idle p50", shared["p50"] <= 1.5 * idle["p50"]),
              ("bulk tokens/s shared >= 0.85x solo", shared_rate >= 0.85 * solo_rate)]
    print()
    for name, met in checks:
        print(f"- {name}: {'met' if met else 'NOT met'}")
    return 0
