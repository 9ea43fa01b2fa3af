"""``python -m bench bulk``: ``embedserve embed`` against sentence-transformers' ``encode``.

The corpus is real multilingual text of mixed lengths: the lines of the
Universal Declaration of Human Rights in 388 languages (``text/udhr2`` of
the reference data), cycled through the files so that every language
appears, written as JSON Lines. Everything runs in float32 on the CPU.

Measured in one run, on one machine, so the ratios mean something where the
absolute numbers (a shared machine) may not:

1. throughput: ``embedserve embed`` (a child process; tokens/s from its own
   summary, model loading excluded) vs ``SentenceTransformer.encode`` with
   its own length sorting and the best ``batch_size`` of a short sweep
   (model loading excluded), on the same texts; the ratio is embedserve / ST;
2. memory: the peak resident set (VmHWM) of ``embedserve embed`` on N and on
   10N documents (streaming: it should barely grow);
3. Ray: ``embedserve embed --ray local`` (one actor) vs the in-process run,
   wall time of each child process (Ray's start-up included: it is part of
   what a user waits for).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from bench.reference_data import DEFAULT_DATA_DIR, MISSING_EXIT_STATUS, missing_line

ROOT = Path(__file__).resolve().parents[1]
SUMMARY = re.compile(r"embedded (\d+) documents, (\d+) tokens in ([\d.]+) s")


def corpus(data_dir: Path, count: int) -> list[str]:
    """``count`` lines, taken round-robin over the UDHR files (every language, mixed lengths)."""
    files = sorted((data_dir / "text" / "udhr2").glob("*.txt"))
    per_file = [[line.strip() for line in f.read_text(errors="replace").splitlines() if line.strip()]
                for f in files]
    out: list[str] = []
    depth = 0
    while len(out) < count and depth < max(map(len, per_file)):
        out += [lines[depth] for lines in per_file if depth < len(lines)]
        depth += 1
    while len(out) < count:  # more than the corpus has: repeat it
        out += out[:count - len(out)]
    return out[:count]


def write_jsonl(path: Path, texts: list[str]) -> Path:
    with open(path, "w") as f:
        for text in texts:
            f.write(json.dumps({"text": text}, ensure_ascii=False) + "\n")
    return path


def run_embed(source: Path, output: Path, model_dir: Path, *extra: str) -> dict[str, float]:
    """One ``embedserve embed`` child: its summary's numbers, wall time and peak RSS (MiB)."""
    command = [sys.executable, "-m", "embedserve.cli", "embed", str(source), "-o", str(output),
               "--model", str(model_dir), "--no-progress", "--overwrite", *extra]
    started = time.monotonic()
    process = subprocess.Popen(command, stderr=subprocess.PIPE, text=True, cwd=ROOT,
                               env=dict(os.environ, PYTHONPATH=str(ROOT)))
    peak = [0]

    def watch() -> None:  # VmHWM is the process's own peak; read it until the process is gone
        status = Path(f"/proc/{process.pid}/status")
        while process.poll() is None:
            try:
                for line in status.read_text().splitlines():
                    if line.startswith("VmHWM:"):
                        peak[0] = max(peak[0], int(line.split()[1]))
            except (FileNotFoundError, ProcessLookupError):
                break
            time.sleep(0.1)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    _, stderr = process.communicate()
    watcher.join()
    wall = time.monotonic() - started
    if process.returncode != 0:
        raise RuntimeError(f"embedserve embed failed ({process.returncode}): {stderr[-2000:]}")
    match = SUMMARY.search(stderr)
    docs, tokens, seconds = int(match.group(1)), int(match.group(2)), float(match.group(3))
    return {"documents": docs, "tokens": tokens, "seconds": seconds, "tokens_per_s": tokens / seconds,
            "wall_s": wall, "peak_rss_mib": peak[0] / 1024}


def sentence_transformers_rate(model_dir: Path, texts: list[str], tokens: int,
                               batch_sizes: tuple[int, ...]) -> tuple[float, int]:
    """(tokens/s, batch_size) of ST's encode at its best batch size (swept on a slice first)."""
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(str(model_dir), device="cpu")
    sweep = texts[:min(len(texts), 2000)]
    timings = {}
    for batch_size in batch_sizes:
        started = time.perf_counter()
        model.encode(sweep, batch_size=batch_size, convert_to_numpy=True)
        timings[batch_size] = time.perf_counter() - started
    best = min(timings, key=timings.get)
    started = time.perf_counter()
    model.encode(texts, batch_size=best, convert_to_numpy=True)
    return tokens / (time.perf_counter() - started), best


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench bulk", description=__doc__.splitlines()[0])
    parser.add_argument("--docs", type=int, default=20_000, help="N documents (default: %(default)s)")
    parser.add_argument("--memory-factor", type=int, default=10, help="the memory run uses this many x N")
    parser.add_argument("--no-memory", action="store_true", help="skip the 10N memory run")
    parser.add_argument("--no-ray", action="store_true", help="skip the Ray run")
    parser.add_argument("--batch-tokens", type=int, default=None, help="embedserve embed --batch-tokens")
    parser.add_argument("--st-batch-sizes", default="16,32,64", help="ST batch sizes swept")
    parser.add_argument("--data-dir", type=Path, default=DEFAULT_DATA_DIR)
    args = parser.parse_args(argv)
    if (problem := missing_line("python -m bench bulk", [args.data_dir / "text" / "udhr2"], "--data-dir")):
        print(problem, file=sys.stderr)
        return MISSING_EXIT_STATUS
    os.environ["HF_HUB_OFFLINE"] = "1"
    from embedserve.defaults.build import ensure_default_model
    from embedserve.defaults.model_args import default_cache_dir

    model_dir = ensure_default_model(default_cache_dir())
    extra = ("--batch-tokens", str(args.batch_tokens)) if args.batch_tokens else ()
    print(f"load average at start: {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores", flush=True)
    with tempfile.TemporaryDirectory(prefix="bulk-bench-") as tmp:
        work = Path(tmp)
        texts = corpus(args.data_dir, args.docs)
        source = write_jsonl(work / "corpus.jsonl", texts)
        ours = run_embed(source, work / "out.parquet", model_dir, *extra)
        print(f"embedserve embed: {ours['documents']} docs, {ours['tokens']} tokens, "
              f"{ours['tokens_per_s']:,.0f} tokens/s, peak RSS {ours['peak_rss_mib']:.0f} MiB", flush=True)
        st_rate, st_batch = sentence_transformers_rate(
            model_dir, texts, ours["tokens"], tuple(int(b) for b in args.st_batch_sizes.split(",")))
        print(f"sentence-transformers encode (batch_size={st_batch}): {st_rate:,.0f} tokens/s", flush=True)
        print(f"ratio embedserve / sentence-transformers: {ours['tokens_per_s'] / st_rate:.2f}x", flush=True)
        if not args.no_memory:
            big = write_jsonl(work / "big.jsonl", corpus(args.data_dir, args.docs * args.memory_factor))
            large = run_embed(big, work / "big.parquet", model_dir, *extra)
            print(f"peak RSS: {ours['peak_rss_mib']:.0f} MiB for {args.docs} docs, "
                  f"{large['peak_rss_mib']:.0f} MiB for {args.docs * args.memory_factor} docs "
                  f"({large['tokens_per_s']:,.0f} tokens/s)", flush=True)
        if not args.no_ray:
            on_ray = run_embed(source, work / "ray.parquet", model_dir, "--ray", "local", *extra)
            same = (work / "ray.parquet").read_bytes() == (work / "out.parquet").read_bytes()
            print(f"Ray (local, 1 actor): wall {on_ray['wall_s']:.1f} s vs in-process {ours['wall_s']:.1f} s "
                  f"({on_ray['tokens_per_s']:,.0f} vs {ours['tokens_per_s']:,.0f} tokens/s in the run); "
                  f"output identical: {same}", flush=True)
    print(f"load average at end: {os.getloadavg()[0]:.2f}")
    return 0
