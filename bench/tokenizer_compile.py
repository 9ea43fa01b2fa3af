"""The tokenizer's first use on a fresh install: seconds until its kernels are compiled.

    python -m bench tokenizer_compile [--stack DIR ...] [--mode hf --mode sentencepiece]

Numba compiles the tokenizer's kernels on first use and caches them on disk, so a new
install (a fresh clone, a new image without the cache, every CI run) pays this once per
mode before its first answer; later starts load the cache. For each ``--stack`` tree
(put first on PYTHONPATH; default: this checkout) and mode, a fresh process with an
empty ``NUMBA_CACHE_DIR`` loads the default model's tokenizer, runs what a server runs
(``encode_batch()``, with offsets or without: one kernel; "server s" is load plus that),
and then ``encode()``, which library callers use. Each phase's wall seconds are
reported, and CPU seconds of the whole process (from ``resource``, which background
load hardly moves). Trees alternate per mode, so load falls on both alike
(``--stack /tmp/before --stack .`` is a before/after).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# Run in the child: each phase's wall seconds, then the process's CPU seconds, as JSON.
_CHILD = """
import json, resource, sys, time
from embedserve.defaults.build import ensure_default_model
from embedserve.defaults.model_args import default_cache_dir
from embedserve.tokenizer import load_tokenizer
model_dir = ensure_default_model(default_cache_dir())
phases = {}
started = time.perf_counter()
tokenizer = load_tokenizer(model_dir, sys.argv[1])
phases["load"] = time.perf_counter() - started
started = time.perf_counter()
tokenizer.encode_batch(["two", "texts"])
phases["encode_batch()"] = time.perf_counter() - started
started = time.perf_counter()
tokenizer.encode("a first text")
phases["encode()"] = time.perf_counter() - started
usage = resource.getrusage(resource.RUSAGE_SELF)
phases["CPU"] = usage.ru_utime + usage.ru_stime
print(json.dumps(phases))
"""


def first_use(tree: Path, mode: str) -> dict[str, float]:
    """Seconds of each phase of a first use in ``mode`` from ``tree``, with an empty cache."""
    with tempfile.TemporaryDirectory(prefix="numba-cache-") as cache:
        env = dict(os.environ, PYTHONPATH=str(tree), NUMBA_CACHE_DIR=cache)
        done = subprocess.run([sys.executable, "-c", _CHILD, mode], env=env, cwd=str(tree),
                              capture_output=True, text=True, check=True)
    return json.loads(done.stdout.splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--stack", action="append", type=Path,
                        help="a source tree to measure (repeatable; default: this checkout)")
    parser.add_argument("--mode", action="append", choices=["hf", "sentencepiece"],
                        help="tokenizer mode (repeatable; default: both)")
    args = parser.parse_args(argv)
    trees = [tree.resolve() for tree in args.stack or [ROOT]]
    print(f"1-minute load average {os.getloadavg()[0]:.2f} at the start")
    print("| tree | mode | load s | encode_batch() s | server s | encode() s | total s | CPU s |")
    print("|---|---|---:|---:|---:|---:|---:|---:|")
    for mode in args.mode or ["hf", "sentencepiece"]:
        for tree in trees:
            phases = first_use(tree, mode)
            server = phases["load"] + phases["encode_batch()"]
            total = server + phases["encode()"]
            print(f"| {tree} | {mode} | {phases['load']:.1f} | {phases['encode_batch()']:.1f} | {server:.1f} | "
                  f"{phases['encode()']:.1f} | {total:.1f} | {phases['CPU']:.1f} |", flush=True)
    print(f"1-minute load average {os.getloadavg()[0]:.2f} at the end")
    return 0


if __name__ == "__main__":
    sys.exit(main())
