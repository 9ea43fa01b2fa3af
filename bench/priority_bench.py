"""``python -m bench priority``: online queries while a bulk job runs through the same server.

Issue 46's check of the priority classes (docs/priority.md), on one default
``embedserve serve`` (flags after ``--serve-args`` are added to it):

0. warm-up (unmeasured): 20 queries, then a bulk job of ``WARM_DOCS`` documents;
1. **idle**: one interactive client sends a short query (``/v1/embeddings``, one
   text of a few words) every ``--interval-ms``, waiting for each answer, for
   ``--queries`` queries;
2. **bulk solo** and **shared**, ``--rounds`` times (8: a round's ratio moves by +-0.1 with
   this host's speed over its ~20 s, so fewer rounds give a median that moves by 0.05) in ABBA order (solo then shared,
   then shared then solo, ...), so that a host that speeds up or slows down during the
   run biases neither side: ``embedserve embed --url`` re-embeds ``--docs`` documents of
   the bulk benchmark's mixed corpus (``bench/bulk_corpus.py``) through the server (it
   sends them in the batch class; ``--serve-args "--route-priority
   /v1/embeddings=interactive"`` runs them as interactive: the first-come-first-served
   baseline), alone, and with the interactive client running all along; only the
   queries sent while the gateway held the bulk job's tokens count (its
   ``embedserve_gateway_inflight_tokens`` gauge, polled once a second: a ``/metrics``
   scrape costs CPU, and at 10 a second it took ~12 % of a 2-core machine from the bulk
   job being measured; the solo runs poll it too, so both sides pay the same).

Reported: the interactive p50/p90/p99 idle and during the bulk job; the bulk job's
tokens/s (its own summary: from its first request to its last answer) per round, solo
and shared, and the median of the rounds' shared / solo ratios; and, per phase, the CPU
seconds each party spent per 1M bulk tokens (replicas, gateway, the ``embed`` client,
the interactive client), with the CPU each interactive query added. CPU time moves far
less than wall time on a shared machine: it says where a shared run's time went. The
targets (issue 46): shared p99 <= 250 ms, shared p50 <= 1.5x idle p50, shared bulk
tokens/s >= 85 % of solo (median of the rounds).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import resource
import shlex
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from bench import bulk_corpus
from bench.bulk_bench import run_embed
from bench.reference_data import DEFAULT_DATA_DIR, MISSING_EXIT_STATUS, missing_line

ROOT = Path(__file__).resolve().parents[1]
WARM_DOCS = 300
SERVE_WARM_QUERIES = 20     # unmeasured queries first: the engine's short-step shapes
QUERIES = ("how do I reset my password", "opening hours of the city library",
           "cheap flights to lisbon in may", "symptoms of vitamin d deficiency",
           "best way to learn python", "weather tomorrow in berlin")
# The gateway's tokens in flight, all classes: above a short query's few tokens, the bulk
# job is in flight (also when --route-priority runs it as interactive, the FCFS baseline).
INFLIGHT = re.compile(r'^embedserve_gateway_inflight_tokens\{[^}]*\} ([0-9.e+]+)$', re.MULTILINE)
BULK_INFLIGHT_TOKENS = 256
# How often the bulk job's window is polled (/metrics): its edges are this precise.
WINDOW_POLL_S = 1.0


def log(message: str) -> None:
    print(f"[priority] {message}", file=sys.stderr, flush=True)


# Server-Timing phases (gateway/middleware.py), medians printed: where the time went.
# ``rpc`` minus ``replica`` is the hop to the replica and back, including the wait
# for the step the replica's loop is computing when the call arrives.
PHASES = ("parse", "tokenize", "dispatch", "rpc", "replica", "queue", "inference", "encode", "total")


def interactive_client(base_url: str, interval_s: float, stop: threading.Event,
                       max_queries: int | None, client_kind: str = "httpx",
                       cpu: list[float] | None = None,
                       active: threading.Event | None = None) -> list[tuple[float, float, dict[str, float]]]:
    """(send time, latency s, Server-Timing phases in s) of each query: one every
    ``interval_s`` (or right after the previous answer when that came later), until
    ``stop`` or ``max_queries``; with ``active``, only while it is set (the period starts
    again when it is). ``client_kind``: overhead_bench's clients (httpx, as an
    application would; raw, a bare socket that costs the machine least). The thread's CPU
    seconds are added to ``cpu[0]``."""
    from bench.overhead_bench import CLIENTS

    results: list[tuple[float, float, dict[str, float]]] = []
    started_cpu = time.thread_time()
    client: Any = CLIENTS[client_kind](base_url)   # RawClient | HttpxClient
    try:
        next_at = time.monotonic()
        k = 0
        while not stop.is_set() and (max_queries is None or k < max_queries):
            if active is not None and not active.is_set():
                active.wait(0.05)
                next_at = time.monotonic()
                continue
            delay = next_at - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            body = json.dumps({"input": QUERIES[k % len(QUERIES)], "input_type": "query"}).encode()
            sent = time.monotonic()
            status, timing = client.request("POST", "/v1/embeddings", body)
            latency = time.monotonic() - sent
            if status != 200:
                raise RuntimeError(f"interactive query answered {status}")
            results.append((sent, latency, server_timing(timing)))
            next_at += interval_s
            k += 1
    finally:
        client.close()
        if cpu is not None:
            cpu[0] += time.thread_time() - started_cpu
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
        # A scrape costs the gateway and the replica CPU (~12 ms on the 2-core host): polled
        # every 100 ms it took ~12 % of the machine from the bulk job it measures.
        stop.wait(WINDOW_POLL_S)


@contextlib.contextmanager
def bulk_window(base_url: str) -> Iterator[list[float]]:
    """``batch_active_window`` on a thread for the block: the [first, last] time the gateway
    held the bulk job's tokens, complete once the block has ended. Solo and shared runs both
    poll so: the scrapes cost the server CPU, which only the shared side paid before."""
    stop = threading.Event()
    window: list[float] = []
    watcher = threading.Thread(target=batch_active_window, args=(base_url, stop, window))
    watcher.start()
    try:
        yield window
    finally:
        stop.set()
        watcher.join()


def percentiles(results: list[tuple[float, float, dict[str, float]]]) -> dict[str, float]:
    values = np.asarray([latency for _, latency, _ in results]) * 1e3
    row = {"n": len(values), "p50": float(np.percentile(values, 50)),
           "p90": float(np.percentile(values, 90)), "p99": float(np.percentile(values, 99)),
           "max": float(values.max())}
    for phase in {name for _, _, t in results for name in t}:
        row[phase] = float(np.median([t.get(phase, 0.0) for _, _, t in results])) * 1e3
    return row


def parse_arguments(parser: argparse.ArgumentParser, argv: list[str] | None) -> argparse.Namespace | None:
    """``parser``'s arguments plus the flags both priority benchmarks take (the client, the
    server's flags, the data); None, with the line saying so printed, where the reference
    data is missing."""
    parser.add_argument("--interval-ms", type=float, default=50.0,
                        help="interactive client's period (default: %(default)s)")
    parser.add_argument("--serve-args", default="",
                        help="extra flags for embedserve serve, one string (default: none)")
    parser.add_argument("--client", choices=("httpx", "raw"), default="httpx",
                        help="the interactive client: httpx as an application would use, or a bare "
                             "socket that costs the 2-core machine least (default: %(default)s)")
    return parse_with_corpus(parser, argv)


def parse_with_corpus(parser: argparse.ArgumentParser, argv: list[str] | None) -> argparse.Namespace | None:
    """``parser``'s arguments plus ``--data-dir`` (the bulk corpus's source) and ``--work-dir``
    (server logs); None, with the line saying so printed, where the reference data is missing."""
    parser.add_argument("--data-dir", type=Path, default=DEFAULT_DATA_DIR)
    parser.add_argument("--work-dir", type=Path, default=Path.home() / ".cache" / "embedserve" / "bench",
                        help="server logs (default: %(default)s)")
    args = parser.parse_args(argv)
    missing = missing_line(parser.prog, [bulk_corpus.udhr_dir(args.data_dir)], "--data-dir")
    if missing:
        print(missing, file=sys.stderr)
        return None
    return args


@dataclass
class Served:
    """A warm default ``embedserve serve`` and the bulk job's files (``warm_serve``)."""

    base_url: str
    pid: int
    model_dir: Path
    corpus: Path
    output: Path


@contextlib.contextmanager
def warm_serve(args: argparse.Namespace, docs: int) -> Iterator[Served]:
    """One default ``embedserve serve`` (plus ``--serve-args``), warmed up unmeasured: a few
    queries (the engine's short-step shapes) and a small bulk job (its shapes, the ``embed``
    client's first tokenizer load); and a corpus of ``docs`` mixed documents for the job."""
    from bench.suite.peer_process import running_server
    from bench.suite.systems import SERVE_READY_TIMEOUT_S, serve_command
    from embedserve.defaults.build import ensure_default_model
    from embedserve.defaults.model_args import default_cache_dir
    from embedserve.launch.processes import free_port

    model_dir = ensure_default_model(default_cache_dir())
    port = free_port()
    base_url = f"http://127.0.0.1:{port}"
    command = [*serve_command(model_dir, port, "cpu", None), *shlex.split(args.serve_args)]
    with tempfile.TemporaryDirectory(prefix="embedserve-priority-") as tmp:
        corpus = bulk_corpus.write_jsonl(Path(tmp) / "docs.jsonl", bulk_corpus.mixed(args.data_dir, docs))
        warm_corpus = bulk_corpus.write_jsonl(Path(tmp) / "warm.jsonl", bulk_corpus.mixed(args.data_dir, WARM_DOCS))
        output = Path(tmp) / "out.parquet"
        with running_server(command, name="embedserve serve", health_url=f"{base_url}/ready",
                            log_path=args.work_dir / "priority-serve.log",
                            env=dict(os.environ, PYTHONPATH=str(ROOT)),
                            ready_timeout_s=SERVE_READY_TIMEOUT_S, log=log) as server:
            interactive_client(base_url, args.interval_ms / 1e3, threading.Event(), SERVE_WARM_QUERIES, args.client)
            run_embed(warm_corpus, output, model_dir, "--url", base_url)
            yield Served(base_url, server.pid, model_dir, corpus, output)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench priority", description=__doc__.splitlines()[0])
    parser.add_argument("--docs", type=int, default=3000, help="bulk job documents (default: %(default)s)")
    parser.add_argument("--queries", type=int, default=200,
                        help="interactive queries in the idle run (default: %(default)s)")
    parser.add_argument("--rounds", type=int, default=8,
                        help="solo and shared bulk runs, in ABBA order (default: %(default)s)")
    args = parse_arguments(parser, argv)
    if args is None:
        return MISSING_EXIT_STATUS

    interval = args.interval_ms / 1e3
    solos: list[Phase] = []
    shareds: list[Phase] = []
    client_results: list[tuple[float, float, dict[str, float]]] = []
    with warm_serve(args, args.docs) as served:
        base_url, model_dir, corpus, output = served.base_url, served.model_dir, served.corpus, served.output
        meter = CpuMeter(served.pid)
        log(f"idle: {args.queries} queries, one every {args.interval_ms:.0f} ms")
        idle = percentiles(interactive_client(base_url, interval, threading.Event(), args.queries, args.client))
        for round_ in range(args.rounds):
            # ABBA: solo first in even rounds, shared first in odd ones, so that a host
            # slowing down or speeding up over the run biases neither side
            order = ("solo", "shared") if round_ % 2 == 0 else ("shared", "solo")
            for kind in order:
                log(f"round {round_ + 1}/{args.rounds}, {kind}: {args.docs} documents")
                if kind == "solo":
                    solos.append(measure_solo(meter, corpus, output, model_dir, base_url))
                else:
                    shared_phase, during = measure_shared(meter, corpus, output, model_dir, base_url,
                                                          interval, args.client)
                    shareds.append(shared_phase)
                    client_results.extend(during)
    if not client_results:
        log("the shared runs saw no bulk tokens in flight: nothing measured")
        return 1
    shared = percentiles(client_results)
    ratios = [both.rate / alone.rate for both, alone in zip(shareds, solos, strict=True)]
    solo_rate = float(np.median([phase.rate for phase in solos]))
    shared_rate = float(np.median([phase.rate for phase in shareds]))
    tokens = int(solos[0].tokens)
    print(f"\nembedserve serve {args.serve_args or '(defaults)'}; {args.docs} documents, {tokens:,} tokens; "
          f"one query every {args.interval_ms:.0f} ms, client {args.client}; {args.rounds} rounds (ABBA)\n")
    print("| interactive | queries | p50 ms | p90 ms | p99 ms | max ms |\n|---|---:|---:|---:|---:|---:|")
    for name, row in (("idle", idle), ("during bulk", shared)):
        print(f"| {name} | {row['n']} | {row['p50']:.1f} | {row['p90']:.1f} | {row['p99']:.1f} | "
              f"{row['max']:.1f} |")
    print("\nServer-Timing medians, ms (rpc - replica: the hop, and the wait for the step being "
          "computed when the call arrived):\n")
    print("| interactive | " + " | ".join(PHASES) + " |\n|---|" + "---:|" * len(PHASES))
    for name, row in (("idle", idle), ("during bulk", shared)):
        print(f"| {name} | " + " | ".join(f"{row.get(p, 0.0):.1f}" for p in PHASES) + " |")
    print("\nBulk job per round; CPU seconds per 1M bulk tokens (user + system, all threads) of the "
          "replicas, the gateway, the `embed --url` client and the interactive client, the "
          "interactive queries the round held, and the machine's steal time (the hypervisor running "
          "something else):\n")
    print("| round | phase | tokens/s | vs solo | replicas | gateway | embed client | interactive client "
          "| queries | steal s |\n|---|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for round_, (solo_phase, shared_phase) in enumerate(zip(solos, shareds, strict=True), 1):
        for name, phase in (("solo", solo_phase), ("shared", shared_phase)):
            per = 1e6 / phase.tokens
            print(f"| {round_} | {name} | {phase.rate:,.0f} | {phase.rate / solo_phase.rate:.2f} | "
                  f"{phase.replicas * per:.1f} | {phase.gateway * per:.1f} | {phase.embed_client * per:.1f} | "
                  f"{phase.interactive * per:.1f} | {phase.queries} | {phase.steal:.2f} |")
    extra = [(both.total - alone.total * both.tokens / alone.tokens) / both.queries
             for both, alone in zip(shareds, solos, strict=True) if both.queries]
    pooled = (sum(p.tokens for p in shareds) / sum(p.seconds for p in shareds)) / \
        (sum(p.tokens for p in solos) / sum(p.seconds for p in solos))
    print(f"\nbulk shared / solo per round: {', '.join(f'{r:.2f}' for r in ratios)}; median {np.median(ratios):.2f} "
          f"(quartiles {np.percentile(ratios, 25):.2f}-{np.percentile(ratios, 75):.2f}; all shared / all solo "
          f"{pooled:.2f}; median tokens/s solo {solo_rate:,.0f}, shared {shared_rate:,.0f}). CPU each interactive "
          f"query added (all processes, shared minus solo at the same bulk tokens): "
          f"{', '.join(f'{e * 1e3:.1f}' for e in extra)} ms")
    checks = [("interactive p99 during bulk <= 250 ms", shared["p99"] <= 250.0),
              ("interactive p50 during bulk <= 1.5x idle p50", shared["p50"] <= 1.5 * idle["p50"]),
              ("bulk tokens/s shared >= 0.85x solo (median of rounds)", float(np.median(ratios)) >= 0.85)]
    print()
    for name, met in checks:
        print(f"- {name}: {'met' if met else 'NOT met'}")
    return 0


@dataclass
class Phase:
    """One bulk job: its tokens and seconds (its own summary), and the CPU seconds each
    party spent meanwhile."""

    tokens: float
    seconds: float
    replicas: float = 0.0
    gateway: float = 0.0
    embed_client: float = 0.0
    interactive: float = 0.0
    queries: int = 0
    steal: float = 0.0   # the machine's steal time meanwhile (``steal_seconds``)

    @property
    def rate(self) -> float:
        return self.tokens / self.seconds

    @property
    def total(self) -> float:
        return self.replicas + self.gateway + self.embed_client + self.interactive


class CpuMeter:
    """CPU seconds so far of the server (the gateway: serve's own process), its replicas
    (serve's children) and this process's finished children (the ``embed`` client), and
    the machine's steal time (``steal_seconds``)."""

    def __init__(self, server_pid: int) -> None:
        self._pid = server_pid

    def read(self) -> tuple[float, float, float, float]:
        from bench.overhead_bench import child_pids, cpu_seconds

        children = resource.getrusage(resource.RUSAGE_CHILDREN)
        return (sum(map(cpu_seconds, child_pids(self._pid))), cpu_seconds(self._pid),
                children.ru_utime + children.ru_stime, steal_seconds())


def steal_seconds(stat: Path = Path("/proc/stat")) -> float:
    """Seconds the hypervisor ran something else while this VM's CPUs wanted to run, all
    CPUs together, so far (``/proc/stat``'s steal column; 0 where there is none): a round
    the host took cycles from shows it here, where the guest's own figures do not."""
    try:
        fields = stat.read_text().splitlines()[0].split()
    except OSError:
        return 0.0
    return int(fields[8]) / os.sysconf("SC_CLK_TCK") if fields[0] == "cpu" and len(fields) > 8 else 0.0


def measure_solo(meter: CpuMeter, corpus: Path, output: Path, model_dir: Path, base_url: str) -> Phase:
    """The bulk job alone (with the same ``/metrics`` poll as a shared run: ``bulk_window``)."""
    before = meter.read()
    with bulk_window(base_url):
        run = run_embed(corpus, output, model_dir, "--url", base_url)
    replicas, gateway, embed_client, steal = (a - b for a, b in zip(meter.read(), before, strict=True))
    return Phase(run["tokens"], run["seconds"], replicas, gateway, embed_client, steal=steal)


def measure_shared(meter: CpuMeter, corpus: Path, output: Path, model_dir: Path, base_url: str,
                   interval: float, client_kind: str) -> tuple[Phase, list[tuple[float, float, dict[str, float]]]]:
    """The bulk job with the interactive client running all along; the queries sent while the
    gateway held the bulk job's tokens."""
    stop = threading.Event()
    client_cpu = [0.0]
    client_results: list[tuple[float, float, dict[str, float]]] = []
    client = threading.Thread(target=lambda: client_results.extend(
        interactive_client(base_url, interval, stop, None, client_kind, client_cpu)))
    before = meter.read()
    with bulk_window(base_url) as window:
        client.start()
        run = run_embed(corpus, output, model_dir, "--url", base_url)
        after = meter.read()
        stop.set()
        client.join()
    replicas, gateway, embed_client, steal = (a - b for a, b in zip(after, before, strict=True))
    during = [r for r in client_results if window and window[0] <= r[0] <= window[1]]
    # the client's CPU over its whole run, scaled to the queries that fell in the window
    interactive = client_cpu[0] * len(during) / max(1, len(client_results))
    return Phase(run["tokens"], run["seconds"], replicas, gateway, embed_client, interactive,
                 len(during), steal), during
