"""``python -m bench bulk``: ``embedserve embed`` against sentence-transformers, infinity-emb and ``--url``.

The defaults are issue 15's full run (``bench/bulk_corpus.py`` says what the
corpora are): 20,000 documents of mixed lengths in real multilingual text,
float32 and bfloat16, multilingual-e5-small on the CPU, every contender fed
the same texts with e5's ``passage: `` prompt, long paragraphs cut at the
model's 512 tokens (``--long-inputs truncate``; ST and infinity truncate too).
Per dtype, one after another on the same machine:

- ``embedserve embed`` in its own process;
- sentence-transformers ``encode`` (its own length sorting, the best
  ``batch_size`` of a sweep on the first 2,000 documents) in this process;
- the same texts through infinity-emb's HTTP API (``bench/suite/peer_infinity.py``
  starts it; requests of ``HTTP_BATCH`` texts, ``HTTP_IN_FLIGHT`` at a time so
  its own queue can batch and sort);
- ``embedserve embed --url`` through ``embedserve serve`` (one replica).

Then (float32): ``embedserve embed --ray local`` (one actor, so it is one
process's worth of compute: the comparison is the Ray overhead), and the
memory run: peak resident set (VmHWM) of ``embedserve embed`` on N and on
10N *short* documents (one word each: the 10N run stays affordable, and per
document state, what would grow with the corpus, is all it has).

Two rates per contender, both tokens / seconds over the same token count:
**steady** is the job with the model already loaded (embed: its own summary,
which starts after loading and includes reading, tokenizing, packing,
writing; ST: ``encode``; HTTP: the requests, server already up), **end to
end** adds starting the process and loading the model (for HTTP: starting
the server). Ratios are against sentence-transformers' steady rate.
A markdown table (for BENCHMARKS.md) is printed and written with a PNG
(``bulk_throughput.png``) to ``--out-dir``.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from bench import bulk_corpus
from bench.reference_data import DEFAULT_DATA_DIR, MISSING_EXIT_STATUS, missing_line

ROOT = Path(__file__).resolve().parents[1]
SUMMARY = re.compile(r"embedded (\d+) documents, (\d+) tokens in ([\d.]+) s")
PROMPT = "passage: "
HTTP_BATCH = 64          # texts per HTTP request to infinity
HTTP_IN_FLIGHT = 8       # requests in flight: enough queued for its batcher to fill and sort
CONTENDERS = ("embed", "st", "infinity", "url", "ray")
DEFAULT_WORK_DIR = Path.home() / ".cache" / "embedserve" / "bench"   # the suite's: peer venvs, logs


@dataclass
class Result:
    contender: str
    dtype: str
    tokens: int
    steady_s: float
    end_to_end_s: float
    note: str = ""
    peak_rss_mib: float = 0.0
    extra: dict = field(default_factory=dict)

    @property
    def steady_rate(self) -> float:
        return self.tokens / self.steady_s

    @property
    def end_to_end_rate(self) -> float:
        return self.tokens / self.end_to_end_s


def log(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


# ---- embedserve embed (a child process) ------------------------------------------------
def run_embed(source: Path, output: Path, model_dir: Path, *extra: str) -> dict[str, float]:
    """One ``embedserve embed`` child: its summary's numbers, wall time and peak RSS (MiB)."""
    command = [sys.executable, "-m", "embedserve.cli", "embed", str(source), "-o", str(output),
               "--model", str(model_dir), "--input-type", "passage", "--long-inputs", "truncate",
               "--no-progress", "--overwrite", *extra]
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
    return {"documents": int(match.group(1)), "tokens": int(match.group(2)), "seconds": float(match.group(3)),
            "wall_s": wall, "peak_rss_mib": peak[0] / 1024}


def embed_result(name: str, dtype: str, run: dict[str, float], note: str, started_s: float = 0.0) -> Result:
    return Result(name, dtype, run["tokens"], run["seconds"], run["wall_s"] + started_s, note,
                  run["peak_rss_mib"])


# ---- sentence-transformers (this process) ----------------------------------------------
def sentence_transformers_run(model_dir: Path, texts: list[str], tokens: int, dtype: str,
                              batch_sizes: tuple[int, ...]) -> Result:
    import torch
    from sentence_transformers import SentenceTransformer

    started = time.perf_counter()
    model = SentenceTransformer(str(model_dir), device="cpu",
                                model_kwargs={"torch_dtype": getattr(torch, dtype)})
    loaded = time.perf_counter() - started
    prompted = [PROMPT + text for text in texts]
    sweep = prompted[:2000]
    timings = {}
    for batch_size in batch_sizes:
        t0 = time.perf_counter()
        model.encode(sweep, batch_size=batch_size, convert_to_numpy=True)
        timings[batch_size] = time.perf_counter() - t0
    best = min(timings, key=timings.get)
    t0 = time.perf_counter()
    model.encode(prompted, batch_size=best, convert_to_numpy=True)
    seconds = time.perf_counter() - t0
    return Result("sentence-transformers", dtype, tokens, seconds, seconds + loaded,
                  f"`encode`, batch_size {best} (best of {', '.join(map(str, batch_sizes))})")


# ---- an HTTP API (infinity-emb) --------------------------------------------------------
async def _post_all(base_url: str, path: str, model: str, texts: list[str]) -> int:
    import httpx

    chunks = [texts[i:i + HTTP_BATCH] for i in range(0, len(texts), HTTP_BATCH)]
    gate = asyncio.Semaphore(HTTP_IN_FLIGHT)
    received = 0

    async def one(client: httpx.AsyncClient, chunk: list[str]) -> None:
        nonlocal received
        async with gate:
            reply = await client.post(path, json={"model": model, "input": chunk, "encoding_format": "base64"})
            reply.raise_for_status()
            for item in reply.json()["data"]:
                vector = item["embedding"]
                received += len(base64.b64decode(vector)) // 4 if isinstance(vector, str) else len(vector)

    async with httpx.AsyncClient(base_url=base_url, timeout=600) as client:
        await asyncio.gather(*(one(client, chunk) for chunk in chunks))
    return received


def infinity_run(model_dir: Path, texts: list[str], tokens: int, dtype: str, work_dir: Path,
                 install: bool) -> Result:
    from bench.suite.peer_infinity import InfinityConfig, infinity_peer

    prompted = [PROMPT + text for text in texts]
    started = time.perf_counter()
    with infinity_peer(model_dir, None, work_dir, log, install=install,
                       config=InfinityConfig(dtype=dtype)) as peer:
        up = time.perf_counter() - started
        asyncio.run(_post_all(peer.base_url, peer.embeddings_path, peer.model, prompted[:64]))  # warm-up
        t0 = time.perf_counter()
        values = asyncio.run(_post_all(peer.base_url, peer.embeddings_path, peer.model, prompted))
        seconds = time.perf_counter() - t0
    if values % len(texts):
        raise RuntimeError(f"infinity returned {values} values for {len(texts)} texts")
    return Result("infinity-emb HTTP", dtype, tokens, seconds, seconds + up,
                  f"{peer.name}; requests of {HTTP_BATCH}, {HTTP_IN_FLIGHT} in flight")


# ---- embedserve embed --url (our gateway) ----------------------------------------------
@contextlib.contextmanager
def embedserve_gateway(model_dir: Path, dtype: str, work_dir: Path):
    from bench.suite.systems import SuiteContext, embedserve_server

    ctx = SuiteContext(model_dir=model_dir, reranker_dir=None, work_dir=work_dir, device="cpu",
                       env=dict(os.environ, PYTHONPATH=str(ROOT)), log=log)
    with embedserve_server(ctx, model_dir, f"embedserve {dtype}", dtype) as peer:
        yield peer


# ---- the report ------------------------------------------------------------------------
def table(results: list[Result], reference: dict[str, float]) -> str:
    lines = ["| contender | dtype | tokens | steady tokens/s | vs ST | end-to-end tokens/s | notes |",
             "|---|---|---:|---:|---:|---:|---|"]
    for r in results:
        ratio = f"**{r.steady_rate / reference[r.dtype]:.2f}x**" if r.dtype in reference else "–"  # ST not run
        lines.append(f"| {r.contender} | {r.dtype} | {r.tokens:,} | {r.steady_rate:,.0f} | "
                     f"{ratio} | {r.end_to_end_rate:,.0f} | {r.note} |")
    return "\n".join(lines)


def plot(results: list[Result], path: Path, title: str) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    contenders = list(dict.fromkeys(r.contender for r in results))
    dtypes = list(dict.fromkeys(r.dtype for r in results))
    width = 0.8 / max(1, 2 * len(dtypes))
    fig, ax = plt.subplots(figsize=(8, 4.5))
    for i, dtype in enumerate(dtypes):
        rows = {r.contender: r for r in results if r.dtype == dtype}
        xs = np.arange(len(contenders))
        for j, (kind, alpha) in enumerate((("steady", 1.0), ("end to end", 0.45))):
            rates = [(rows[c].steady_rate if kind == "steady" else rows[c].end_to_end_rate) if c in rows else 0
                     for c in contenders]
            ax.bar(xs + (2 * i + j - len(dtypes)) * width + width / 2, rates, width, color=f"C{i}",
                   alpha=alpha, label=f"{dtype}, {kind}")
    ax.set_xticks(np.arange(len(contenders)))
    ax.set_xticklabels([c.replace(" --", "\n--") for c in contenders], fontsize=8)  # long labels collide
    ax.set_ylabel("tokens/s")
    ax.set_title(title, fontsize=10)
    ax.grid(True, axis="y", alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench bulk", description=__doc__.splitlines()[0])
    parser.add_argument("--docs", type=int, default=20_000, help="N documents (default: %(default)s)")
    parser.add_argument("--dtypes", default="float32,bfloat16", help="compute dtypes (default: %(default)s)")
    parser.add_argument("--contenders", default=",".join(CONTENDERS),
                        help=f"which to run, of {', '.join(CONTENDERS)} (default: all)")
    parser.add_argument("--memory-docs", type=int, default=20_000,
                        help="short documents in the small memory run (default: %(default)s)")
    parser.add_argument("--memory-factor", type=int, default=10, help="the large memory run has this many x")
    parser.add_argument("--no-memory", action="store_true", help="skip the memory runs")
    parser.add_argument("--batch-tokens", type=int, default=None, help="embedserve embed --batch-tokens")
    parser.add_argument("--st-batch-sizes", default="16,32,64,128", help="ST batch sizes swept")
    parser.add_argument("--no-install", action="store_true", help="report infinity missing instead of installing")
    parser.add_argument("--work-dir", type=Path, default=DEFAULT_WORK_DIR,
                        help="peer venvs and server logs (default: %(default)s)")
    parser.add_argument("--out-dir", type=Path, default=ROOT / "bench",
                        help="where bulk_throughput.png and bulk_results.md go (default: %(default)s)")
    parser.add_argument("--data-dir", type=Path, default=DEFAULT_DATA_DIR)
    args = parser.parse_args(argv)
    wanted = set(args.contenders.split(","))
    if wanted - set(CONTENDERS):
        parser.error(f"unknown contenders: {', '.join(sorted(wanted - set(CONTENDERS)))}")
    needed = [bulk_corpus.udhr_dir(args.data_dir), args.data_dir / "eval" / "xquad"]
    if (problem := missing_line("python -m bench bulk", needed, "--data-dir")):
        print(problem, file=sys.stderr)
        return MISSING_EXIT_STATUS
    os.environ["HF_HUB_OFFLINE"] = "1"
    from embedserve.defaults.build import ensure_default_model
    from embedserve.defaults.model_args import default_cache_dir

    model_dir = ensure_default_model(default_cache_dir())
    extra = ("--batch-tokens", str(args.batch_tokens)) if args.batch_tokens else ()
    command = "python -m bench bulk " + " ".join(argv if argv is not None else sys.argv[1:])
    load_start = os.getloadavg()[0]
    log(f"load average at start: {load_start:.2f} on {os.cpu_count()} cores")
    results: list[Result] = []
    memory: list[str] = []
    with tempfile.TemporaryDirectory(prefix="bulk-bench-") as tmp:
        work = Path(tmp)
        texts = bulk_corpus.mixed(args.data_dir, args.docs)
        source = bulk_corpus.write_jsonl(work / "corpus.jsonl", texts)
        for dtype in args.dtypes.split(","):
            flags = ("--dtype", dtype, *extra)
            ours = run_embed(source, work / f"out-{dtype}.parquet", model_dir, *flags)
            tokens = ours["tokens"]
            log(f"{dtype}: {ours['documents']} documents, {tokens} tokens "
                f"({tokens / ours['documents']:.0f} per document)")
            if "embed" in wanted:
                results.append(embed_result("embedserve embed", dtype, ours, "in process"))
                log(f"  embed: {results[-1].steady_rate:,.0f} tokens/s steady")
            if "st" in wanted:
                results.append(sentence_transformers_run(
                    model_dir, texts, tokens, dtype, tuple(int(b) for b in args.st_batch_sizes.split(","))))
                log(f"  sentence-transformers: {results[-1].steady_rate:,.0f} tokens/s steady")
            if "infinity" in wanted:
                try:
                    results.append(infinity_run(model_dir, texts, tokens, dtype, args.work_dir,
                                                not args.no_install))
                    log(f"  infinity: {results[-1].steady_rate:,.0f} tokens/s steady")
                except Exception as exc:  # a peer that cannot run is reported, not fatal
                    log(f"  infinity: not measured: {exc}")
            if "url" in wanted:
                started = time.monotonic()
                with embedserve_gateway(model_dir, dtype, args.work_dir) as peer:
                    up = time.monotonic() - started
                    run = run_embed(source, work / f"url-{dtype}.parquet", model_dir, "--url", peer.base_url,
                                    *flags)
                results.append(embed_result("embedserve embed --url", dtype, run,
                                            "`embedserve serve`, 1 replica; end to end includes its start",
                                            started_s=up))
                log(f"  --url: {results[-1].steady_rate:,.0f} tokens/s steady")
        if "ray" in wanted:
            dtype = args.dtypes.split(",")[0]
            from embedserve.bulk.ray_job import cpus_per_actor_for  # imports the engine

            # One actor: `--ray local` gives it every core, as the in-process run has them.
            cores = cpus_per_actor_for("local", 1, None)
            run = run_embed(source, work / "ray.parquet", model_dir, "--ray", "local", "--dtype", dtype, *extra)
            same = (work / "ray.parquet").read_bytes() == (work / f"out-{dtype}.parquet").read_bytes()
            results.append(embed_result("embedserve embed --ray local", dtype, run,
                                        f"1 actor, {cores:g} CPUs; output identical to in process: {same}"))
            log(f"  ray: {results[-1].steady_rate:,.0f} tokens/s steady")
        if not args.no_memory:
            for count in (args.memory_docs, args.memory_docs * args.memory_factor):
                short = bulk_corpus.write_jsonl(work / "short.jsonl", bulk_corpus.short(args.data_dir, count))
                run = run_embed(short, work / "short.parquet", model_dir, *extra)
                memory.append(f"| {count:,} | {run['tokens']:,} | {run['peak_rss_mib']:,.0f} | "
                              f"{run['tokens'] / run['seconds']:,.0f} |")
                log(f"  memory: {count} short documents: peak RSS {run['peak_rss_mib']:.0f} MiB")
    load_end = os.getloadavg()[0]
    reference = {r.dtype: r.steady_rate for r in results if r.contender == "sentence-transformers"}
    report = [f"```bash\n{command.strip()}\n```", "",
              f"Load average {load_start:.2f} at start, {load_end:.2f} at end; {os.cpu_count()} cores. "
              f"{args.docs:,} mixed documents (`bench/bulk_corpus.py`).", "", table(results, reference)]
    if memory:
        report += ["", f"Peak RSS of `embedserve embed` (float32) on short documents, "
                       f"{args.memory_docs:,} vs {args.memory_docs * args.memory_factor:,}:", "",
                   "| documents | tokens | peak RSS MiB | tokens/s |", "|---:|---:|---:|---:|", *memory]
    text = "\n".join(report)
    print(text)
    if results:
        args.out_dir.mkdir(parents=True, exist_ok=True)
        png = plot(results, args.out_dir / "bulk_throughput.png",
                   f"bulk embedding, {args.docs:,} mixed multilingual documents, multilingual-e5-small, CPU")
        (args.out_dir / "bulk_results.md").write_text(text + f"\n\n![bulk throughput]({png.name})\n")
        log(f"wrote {png} and {args.out_dir / 'bulk_results.md'}")
    return 0
