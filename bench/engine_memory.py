"""Engine memory under mixed step shapes: one suspect at a time, without the server.

    python -m bench engine_memory [--steps 300] [--variants exact,buckets,onednn-cache-0,jemalloc,...]

Each variant is a child process (allocator and oneDNN settings must be in the
environment before the libraries load) that loads the default model on one
thread and runs ``--steps`` random packed steps shaped like a replica's under
mixed traffic (token counts 5-512, sequences of 5-400 tokens), reading its own
VmRSS after a 20-step warm-up and at five checkpoints. The children run at the
same time (memory, not speed, is measured). Variants:

- ``exact``: exact token counts (``Engine.load(token_buckets=False)``), the old behaviour;
- ``buckets``: the default, token counts rounded up to buckets (engine/cpu_shapes.py);
- ``onednn-cache-0``: exact counts, ``ONEDNN_PRIMITIVE_CACHE_CAPACITY=0`` (no primitive cache);
- ``jemalloc`` / ``tcmalloc``: exact counts with that allocator preloaded (skipped if absent);
- ``mmap-threshold``: exact counts, glibc's ``MALLOC_MMAP_THRESHOLD_=65536`` (large blocks
  always mapped, so freed ones go back to the system);
- ``malloc-trim``: exact counts, ``malloc_trim(0)`` after every step.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import random
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PRELOADS = {"jemalloc": "/usr/lib/x86_64-linux-gnu/libjemalloc.so.2",
            "tcmalloc": "/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4"}
# variant: (token buckets, environment, malloc_trim after each step)
VARIANTS: dict[str, tuple[bool, dict[str, str], bool]] = {
    "exact": (False, {}, False),
    "buckets": (True, {}, False),
    "onednn-cache-0": (False, {"ONEDNN_PRIMITIVE_CACHE_CAPACITY": "0"}, False),
    "jemalloc": (False, {"LD_PRELOAD": PRELOADS["jemalloc"]}, False),
    "tcmalloc": (False, {"LD_PRELOAD": PRELOADS["tcmalloc"]}, False),
    "mmap-threshold": (False, {"MALLOC_MMAP_THRESHOLD_": "65536"}, False),
    "malloc-trim": (False, {}, True),
}
WARMUP_STEPS = 20


def rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS")


def child(steps: int, buckets: bool, trim: bool) -> str:
    """Run the steps in this process; one line: RSS after warm-up, then at each checkpoint."""
    import numpy as np

    from embedserve.defaults.model_args import default_cache_dir
    from embedserve.engine import Batch, Engine

    rng = random.Random(0)

    def batch() -> Batch:
        budget, lengths = rng.randint(5, 512), []
        while budget >= 5:
            lengths.append(min(budget, rng.randint(5, 400)))
            budget -= lengths[-1]
        return Batch.from_sequences([np.full(n, 100, dtype=np.int32) for n in lengths])

    libc = ctypes.CDLL("libc.so.6") if trim else None
    with Engine.load(default_cache_dir() / "multilingual-e5-small", token_buckets=buckets) as engine:
        for _ in range(WARMUP_STEPS):
            engine.step(batch()).wait()
        marks = [rss_mb()]
        for i in range(steps):
            engine.step(batch()).wait()
            if libc is not None:
                libc.malloc_trim(0)
            if (i + 1) % max(1, steps // 5) == 0:
                marks.append(rss_mb())
    return " ".join(f"{m:.0f}" for m in marks)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench engine_memory", description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--variants", default="exact,buckets,onednn-cache-0,jemalloc,mmap-threshold")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        buckets, _, trim = VARIANTS[args.child]
        print(child(args.steps, buckets, trim), flush=True)
        return 0
    names = [n for n in args.variants.split(",") if n]
    unknown = [n for n in names if n not in VARIANTS]
    if unknown:
        parser.error(f"unknown variants {unknown}; choose from {sorted(VARIANTS)}")
    runs = {}
    for name in names:
        _, env, _ = VARIANTS[name]
        if "LD_PRELOAD" in env and not Path(env["LD_PRELOAD"]).exists():
            print(f"{name}: skipped, {env['LD_PRELOAD']} is not installed")
            continue
        runs[name] = subprocess.Popen(
            [sys.executable, "-m", "bench", "engine_memory", "--steps", str(args.steps), "--child", name],
            stdout=subprocess.PIPE, text=True, cwd=ROOT,
            env=dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT), **env))
    print(f"| variant | RSS after {WARMUP_STEPS} steps | at each fifth of {args.steps} steps | final / warm-up |")
    print("|---|---:|---|---:|")
    for name, process in runs.items():
        out, _ = process.communicate()
        marks = [float(m) for m in out.split()] if process.returncode == 0 else []
        if not marks:
            print(f"| {name} | failed (status {process.returncode}) | | |")
            continue
        print(f"| {name} | {marks[0]:.0f} MB | {' → '.join(f'{m:.0f}' for m in marks[1:])} MB | "
              f"{marks[-1] / marks[0]:.2f} |")
    load = os.getloadavg()
    print(f"load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
