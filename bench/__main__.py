"""``python -m bench NAME [ARGS...]``: the same dispatch as ``embedserve bench NAME`` (bench/cli.py)."""

from __future__ import annotations

import argparse
import sys

from bench.cli import BENCHMARKS, run


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__.splitlines()[0])
    parser.add_argument("name", choices=sorted(BENCHMARKS), help="which benchmark")
    parser.add_argument("args", nargs=argparse.REMAINDER, help="arguments for the benchmark")
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
