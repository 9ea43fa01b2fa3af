"""Start-up: time to ready of ``embedserve serve``, cold and warm; a replica's or a gateway tokenizer's start.

    python -m bench startup --process serve [--starts 3] [--stack DIR ...]
    python -m bench startup [--starts 4] [--stack DIR ...] [--dtype auto --dtype float32]
    python -m bench startup --process tokenizer [--starts 4] [--stack DIR ...]

Serve: ``embedserve serve --port 0 --model DEFAULT_MODEL_DIR`` as a user runs it (one
replica, --dtype auto), timed from launch to the first 200 of ``/ready`` (polled every
20 ms), and to the answer of a single-text request sent at that moment ("first answer"),
then to a multi-text one. Cold: an empty Numba cache (a new ``NUMBA_CACHE_DIR``) and an
empty ``HOME`` (no tokenizer trie cache, no int8/uint8 calibration), a first start after
``pip install``; the default model is built beforehand (a download, not a start). Warm:
both kept from an earlier start, with the native tokenizer kernels compiled into them as
the gateway's compile child does. Also reported: which tokenizer served at ready, and the gateway's
kernel first calls outside a warm-up (``when="serving"``: must be 0).

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
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from bench.overhead_bench import cpu_seconds
from embedserve.entrypoint import GATEWAY_LISTENING, SCHEDULER_LISTENING
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


_SERVING_FIRST_CALLS = re.compile(
    r'^embedserve_gateway_tokenizer_kernel_first_calls_total\{when="serving"\} (\S+)$', re.MULTILINE)


class ServeStart:
    """One ``embedserve serve`` start: seconds to ready, to the first answers, and what served."""

    def __init__(self, ready_s: float, first_answer_s: float, multi_answer_s: float, backend: str,
                 serving_first_calls: float) -> None:
        self.ready_s, self.first_answer_s, self.multi_answer_s = ready_s, first_answer_s, multi_answer_s
        self.backend, self.serving_first_calls = backend, serving_first_calls


def serve_once(tree: Path, model_dir: Path, numba_cache: Path, home: Path) -> ServeStart:
    """Start ``embedserve serve`` from ``tree`` with these caches, time it, stop it."""
    env = dict(os.environ, PYTHONPATH=str(tree), PYTHONUNBUFFERED="1", NUMBA_CACHE_DIR=str(numba_cache),
               HOME=str(home))
    env.pop("EMBEDSERVE_CACHE_DIR", None)
    argv = [sys.executable, "-m", "embedserve.cli", "serve", "--port", "0", "--model", str(model_dir)]
    started = time.perf_counter()
    process, match = popen_listening(argv, GATEWAY_LISTENING, env=env, cwd=str(tree))
    try:
        with httpx.Client(base_url=match.group(1), timeout=600) as http:
            while http.get("/ready").status_code != 200:
                time.sleep(0.02)
            ready = time.perf_counter() - started
            http.post("/v1/embeddings", json={"input": "a first query"}).raise_for_status()
            first = time.perf_counter() - started
            http.post("/v1/embeddings", json={"input": ["two texts", "at once"]}).raise_for_status()
            multi = time.perf_counter() - started
            backend = http.get("/info").json()["tokenizer_backend"]
            found = _SERVING_FIRST_CALLS.search(http.get("/metrics").text)
    finally:
        stop_popen(process, 60.0)
    return ServeStart(ready, first, multi, backend, float(found.group(1)) if found else float("nan"))


# Every kernel the routes run, compiled into the cache; a tree from before tokenizer/warm.py
# (a --stack baseline) runs the same calls itself.
_COMPILE = """
import sys
from pathlib import Path
try:
    from embedserve.tokenizer.warm import load_warm
except ImportError:
    from embedserve.tokenizer import load_tokenizer
    tokenizer = load_tokenizer(Path(sys.argv[1]))
    tokenizer.encode_batch(["one"])
    tokenizer.encode_batch(["two", "texts"], max_length=8, truncation="right", return_offsets=True)
    tokenizer.encode_pairs("a", ["b", "c"])
else:
    load_warm(Path(sys.argv[1]), compile=True)
"""


def fill_caches(tree: Path, model_dir: Path, numba_cache: Path, home: Path) -> None:
    """What a first start leaves behind: a start (trie, calibration), then the native kernels
    compiled as the gateway's child would, at normal priority (a loaded machine starves
    that nice-10 child for many minutes)."""
    serve_once(tree, model_dir, numba_cache, home)
    env = dict(os.environ, PYTHONPATH=str(tree), NUMBA_CACHE_DIR=str(numba_cache), HOME=str(home))
    subprocess.run([sys.executable, "-c", _COMPILE, str(model_dir)], env=env, cwd=str(tree), check=True)


def serve_starts(trees: list[Path], starts: int) -> dict[tuple[Path, str], list[ServeStart]]:
    """``starts`` cold and ``starts`` warm starts per tree, trees alternating."""
    from embedserve.defaults.build import ensure_default_model
    from embedserve.defaults.model_args import default_cache_dir

    model_dir = ensure_default_model(default_cache_dir())  # built once, before anything is timed
    samples: dict[tuple[Path, str], list[ServeStart]] = {(t, k): [] for t in trees for k in ("cold", "warm")}
    with tempfile.TemporaryDirectory(prefix="startup-bench-") as work:
        kept = {tree: (Path(work) / f"warm-{i}" / "numba", Path(work) / f"warm-{i}" / "home")
                for i, tree in enumerate(trees)}
        for numba_cache, home in kept.values():
            numba_cache.mkdir(parents=True)
            home.mkdir()
        for tree, (numba_cache, home) in kept.items():  # unmeasured: fills the caches
            fill_caches(tree, model_dir, numba_cache, home)
        for _ in range(starts):
            for tree in trees:
                cold = Path(tempfile.mkdtemp(dir=work))
                (cold / "numba").mkdir()
                (cold / "home").mkdir()
                samples[tree, "cold"].append(serve_once(tree, model_dir, cold / "numba", cold / "home"))
                shutil.rmtree(cold, ignore_errors=True)
                samples[tree, "warm"].append(serve_once(tree, model_dir, *kept[tree]))
    return samples


def report_serve(samples: dict[tuple[Path, str], list[ServeStart]], load_before: float) -> None:
    runs = len(next(iter(samples.values())))
    print(f"embedserve serve start-up on {socket.gethostname()} ({os.cpu_count()} CPUs), {runs} starts "
          f"each; load average {load_before:.2f} before, {os.getloadavg()[0]:.2f} after")
    print("| tree | caches | ready s (median) | first answer s (median) | multi-text answer s (median) "
          "| tokenizer at ready | kernel first calls while serving (max) |")
    print("|---|---|---:|---:|---:|---|---:|")
    for (tree, kind), runs_of in samples.items():
        backends = sorted({r.backend for r in runs_of})
        print(f"| {tree} | {kind} | {statistics.median(r.ready_s for r in runs_of):.2f} "
              f"| {statistics.median(r.first_answer_s for r in runs_of):.2f} "
              f"| {statistics.median(r.multi_answer_s for r in runs_of):.2f} | {', '.join(backends)} "
              f"| {max(r.serving_first_calls for r in runs_of):.0f} |")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench startup", description=__doc__.splitlines()[0])
    parser.add_argument("--starts", type=int, default=4, help="rounds (each starts every tree x dtype once)")
    parser.add_argument("--stack", type=Path, action="append", default=None,
                        help="a source tree to start from (repeat to compare; default: this checkout)")
    parser.add_argument("--dtype", action="append", default=None,
                        help="replica --dtype (repeat; default: auto and float32)")
    parser.add_argument("--process", choices=("serve", "replica", "tokenizer"), default="replica",
                        help="what starts: embedserve serve (cold and warm), a replica, or a gateway's "
                             "tokenizer load (default: replica)")
    args = parser.parse_args(argv)
    trees = [tree.resolve() for tree in args.stack or [ROOT]]
    if args.process == "serve":
        load_before = os.getloadavg()[0]
        report_serve(serve_starts(trees, args.starts), load_before)
        return 0
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
