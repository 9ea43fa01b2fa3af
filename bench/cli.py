"""``embedserve bench NAME [ARGS...]``: run one benchmark module's ``main(argv)``.

To add a benchmark, give its module a ``main(argv: list[str] | None) -> int`` and list
it in ``BENCHMARKS``.
"""

from __future__ import annotations

import argparse
import importlib

BENCHMARKS = {
    "tokenizer": "bench.tokenizer_bench",
    "engine": "bench.engine_bench",
    "gateway": "bench.gateway_bench",
    "faults": "bench.faults",
    "serve": "bench.serve_bench",
    "suite": "bench.suite.cli",
}


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("bench", help="run a benchmark (see bench/)",
                                   description=__doc__.splitlines()[0])
    parser.add_argument("name", choices=sorted(BENCHMARKS), help="which benchmark")
    parser.add_argument("args", nargs=argparse.REMAINDER, help="arguments for the benchmark")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    module = importlib.import_module(BENCHMARKS[args.name])
    return int(module.main(args.args) or 0)
