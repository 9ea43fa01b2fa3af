"""``python -m bench serve_ab``: one bulk job's tokens/s through two ``embedserve serve`` configurations, in turns.

    python -m bench serve_ab --a "--cpu-lanes 1" --b ""            # one lane against the default
    python -m bench serve_ab --a "" --b "--replicas 2" --rounds 6
    python -m bench serve_ab --a "GLIBC_TUNABLES=glibc.malloc.perturb=0" --b ""   # VAR=VALUE first: environment

Starts both servers (the default model, each warmed up with a few queries and a small
bulk job), then runs ``embedserve embed --url`` over ``--docs`` documents of the bulk
benchmark's mixed corpus (``bench/bulk_corpus.py``) against each in turn, ``--rounds``
times in ABBA order: this host's speed drifts by 10-30 % within a minute, so only jobs
run back to back compare the configurations, not the host. Reported: each job's tokens/s
(the ``embed`` client's own summary), B / A per round, and their median. The idle server
costs nothing meanwhile (its OpenMP threads sleep between steps). Needs the reference data
(XQuAD texts: ``--data-dir``, default a ``shared/data`` folder beside the checkout).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shlex
import tempfile
import threading
from pathlib import Path

import numpy as np

from bench import bulk_corpus
from bench.bulk_bench import run_embed
from bench.overhead_bench import environment_and_flags
from bench.priority_bench import ROOT, SERVE_WARM_QUERIES, WARM_DOCS, interactive_client, log, parse_with_corpus
from bench.reference_data import MISSING_EXIT_STATUS


def abba(rounds: int) -> list[str]:
    """The configurations' order over ``rounds`` rounds: A B, B A, A B, ..."""
    return [name for r in range(rounds) for name in (("a", "b") if r % 2 == 0 else ("b", "a"))]


def ratios(rates: dict[str, list[float]]) -> list[float]:
    """B's tokens/s over A's, per round."""
    return [b / a for a, b in zip(rates["a"], rates["b"], strict=True)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench serve_ab", description=__doc__.splitlines()[0])
    parser.add_argument("--a", default="", help="configuration A: VAR=VALUE words for serve's environment, then "
                                                "its flags, one string (default: none)")
    parser.add_argument("--b", default="", help="configuration B, as --a (default: none)")
    parser.add_argument("--docs", type=int, default=3000, help="documents per job (default: %(default)s)")
    parser.add_argument("--rounds", type=int, default=4, help="jobs per configuration (default: %(default)s)")
    args = parse_with_corpus(parser, argv)
    if args is None:
        return MISSING_EXIT_STATUS

    from bench.suite.peer_process import running_server
    from bench.suite.systems import SERVE_READY_TIMEOUT_S, serve_command
    from embedserve.defaults.build import ensure_default_model
    from embedserve.defaults.model_args import default_cache_dir
    from embedserve.launch.processes import free_port

    model_dir = ensure_default_model(default_cache_dir())
    configurations = {"a": environment_and_flags(shlex.split(args.a)),
                      "b": environment_and_flags(shlex.split(args.b))}
    rates: dict[str, list[float]] = {"a": [], "b": []}
    with tempfile.TemporaryDirectory(prefix="embedserve-serve-ab-") as tmp, contextlib.ExitStack() as servers:
        corpus = bulk_corpus.write_jsonl(Path(tmp) / "docs.jsonl", bulk_corpus.mixed(args.data_dir, args.docs))
        warm = bulk_corpus.write_jsonl(Path(tmp) / "warm.jsonl", bulk_corpus.mixed(args.data_dir, WARM_DOCS))
        output = Path(tmp) / "out.parquet"
        urls = {}
        for name in ("a", "b"):
            port = free_port()
            urls[name] = f"http://127.0.0.1:{port}"
            environment, flags = configurations[name]
            servers.enter_context(running_server(
                [*serve_command(model_dir, port, "cpu", None), *flags], name=f"serve {name.upper()}",
                health_url=f"{urls[name]}/ready", log_path=args.work_dir / f"serve-ab-{name}.log",
                env=dict(os.environ, PYTHONPATH=str(ROOT), **environment), ready_timeout_s=SERVE_READY_TIMEOUT_S,
                log=log))
            interactive_client(urls[name], 0.05, threading.Event(), SERVE_WARM_QUERIES, "raw")
            run_embed(warm, output, model_dir, "--url", urls[name])
        for name in abba(args.rounds):
            summary = run_embed(corpus, output, model_dir, "--url", urls[name])
            rates[name].append(summary["tokens"] / summary["seconds"])
            log(f"{name.upper()}: {rates[name][-1]:,.0f} tokens/s")
    per_round = ratios(rates)
    print(f"\nA: embedserve serve {args.a or '(defaults)'}\nB: embedserve serve {args.b or '(defaults)'}\n"
          f"{args.docs} documents a job, {args.rounds} rounds (ABBA)\n")
    print("| round | A tokens/s | B tokens/s | B / A |\n|---:|---:|---:|---:|")
    for i, (a, b, ratio) in enumerate(zip(rates["a"], rates["b"], per_round, strict=True), 1):
        print(f"| {i} | {a:,.0f} | {b:,.0f} | {ratio:.2f} |")
    print(f"\nB / A: median **{np.median(per_round):.2f}** (range {min(per_round):.2f}-{max(per_round):.2f}); "
          f"median tokens/s A {np.median(rates['a']):,.0f}, B {np.median(rates['b']):,.0f}")
    return 0
