"""Start-up: CPU and wall seconds of a replica (to "listening") or a gateway's tokenizer load.

    python -m bench startup [--starts 4] [--stack DIR ...] [--dtype auto --dtype float32]
    python -m bench startup --process tokenizer [--starts 4] [--stack DIR ...]

Replica: starts ``embedserve scheduler --port 0 --dtype D`` (default model) from each
``--stack`` tree (put first on PYTHONPATH; default: this checkout) in turn, once per
dtype per round, so background load falls on every tree alike (``--stack /tmp/old
--stack .`` is a before/after in one run), and stops it once it prints that it is
listening (ready: model loaded, probed, warmed up). Tokenizer: a new Python imports
the gateway's app, as a gateway starts, then loads the default model's tokenizer the
way it does (``load_tokenizer``); timed from launch to the load's end. Reports the
median over ``--starts`` rounds of the process's CPU seconds (user + system of all its
threads, from /proc, which load hardly moves) and wall seconds. A replica's start is
paid at every deployment, scale-up and restart after a failure, the tokenizer's at
every gateway start.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import sys
import time
from pathlib import Path

from bench.overhead_bench import cpu_seconds
from embedserve.entrypoint import SCHEDULER_LISTENING
from embedserve.launch.processes import popen_listening, stop_popen

ROOT = Path(__file__).resolve().parent.parent


def start_once(tree: Path, dtype: str) -> tuple[float, float]:
    """(CPU s, wall s) of one replica start from ``tree``, up to its listening line."""
    env = dict(os.environ, PYTHONPATH=str(tree), PYTHONUNBUFFERED="1")
    argv = [sys.executable, "-m", "embedserve.cli", "scheduler", "--port", "0", "--dtype", dtype]
    started = time.perf_counter()
    process, _ = popen_listening(argv, SCHEDULER_LISTENING, env=env, cwd=str(tree))
    wall = time.perf_counter() - started
    cpu = cpu_seconds(process.pid)
    stop_popen(process, 60.0)
    return cpu, wall


_TOKENIZER_LOADED = re.compile(r"^tokenizer loaded")
_LOAD_TOKENIZER = ("import embedserve.gateway.app\n"
                   "from embedserve.defaults.build import ensure_default_model\n"
                   "from embedserve.defaults.model_args import default_cache_dir\n"
                   "from embedserve.tokenizer.load import load_tokenizer\n"
                   "load_tokenizer(ensure_default_model(default_cache_dir()))\n"
                   "print('tokenizer loaded', flush=True)\n"
                   "import signal; signal.pause()\n")   # held until stopped: /proc still has its CPU


def tokenizer_once(tree: Path) -> tuple[float, float]:
    """(CPU s, wall s) of a new Python that imports the gateway and loads the default tokenizer."""
    env = dict(os.environ, PYTHONPATH=str(tree), PYTHONUNBUFFERED="1")
    started = time.perf_counter()
    process, _ = popen_listening([sys.executable, "-c", _LOAD_TOKENIZER], _TOKENIZER_LOADED, env=env,
                                 cwd=str(tree))
    wall = time.perf_counter() - started
    cpu = cpu_seconds(process.pid)
    stop_popen(process, 60.0)
    return cpu, wall


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench startup", description=__doc__.splitlines()[0])
    parser.add_argument("--starts", type=int, default=4, help="rounds (each starts every tree x dtype once)")
    parser.add_argument("--stack", type=Path, action="append", default=None,
                        help="a source tree to start from (repeat to compare; default: this checkout)")
    parser.add_argument("--dtype", action="append", default=None,
                        help="replica --dtype (repeat; default: auto and float32)")
    parser.add_argument("--process", choices=("replica", "tokenizer"), default="replica",
                        help="what starts: a replica, or a gateway's tokenizer load (default: replica)")
    args = parser.parse_args(argv)
    trees = [tree.resolve() for tree in args.stack or [ROOT]]
    dtypes = ["-"] if args.process == "tokenizer" else args.dtype or ["auto", "float32"]
    from embedserve.defaults.build import ensure_default_model
    from embedserve.defaults.model_args import default_cache_dir

    ensure_default_model(default_cache_dir())  # built once, before anything is timed
    samples: dict[tuple[Path, str], list[tuple[float, float]]] = {(t, d): [] for t in trees for d in dtypes}
    load_before = os.getloadavg()[0]
    for _ in range(args.starts):
        for dtype in dtypes:
            for tree in trees:
                samples[tree, dtype].append(start_once(tree, dtype) if args.process == "replica"
                                            else tokenizer_once(tree))
    print(f"{args.process} start-up, {args.starts} starts each; load average {load_before:.2f} before, "
          f"{os.getloadavg()[0]:.2f} after")
    print("| tree | --dtype | CPU s (median) | wall s (median) |")
    print("|---|---|---:|---:|")
    for (tree, dtype), runs in samples.items():
        print(f"| {tree} | {dtype} | {statistics.median(c for c, _ in runs):.2f} "
              f"| {statistics.median(w for _, w in runs):.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
