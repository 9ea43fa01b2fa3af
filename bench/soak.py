"""Soak: resident memory of ``embedserve serve`` and each replica under hours-like mixed traffic.

    python -m bench soak [--replicas 2] [--clients 8] [--minutes 10] [--interval 5]
                         [--warmup 60] [--env KEY=VALUE ...] [--serve-arg=--dtype=bfloat16 ...]
                         [--pythonpath DIR] [--data-dir DIR] [--out bench/out]

Starts ``embedserve serve --replicas N`` (default model, CPU, ``--auto-truncate
right`` so no input is refused) as a real process, then C client threads send
random batches (1-32 texts of 3-400 words cut from the Universal Declaration of
Human Rights in 388 languages, ``text/udhr2`` of the shared data; a small
generated multilingual sample when that is absent) for D minutes. Every
``--interval`` seconds it reads VmRSS and RssAnon from /proc of the serve
process (the gateway runs in it) and of each replica (its children).

Reports per process: RSS (VmRSS) after warm-up (the first ``--warmup`` seconds of
traffic), at the end, the maximum, final / warm-up, and the slope over the last
half of the run (least squares, MB per minute: ~0 is flat), and the anonymous
part (RssAnon: heap and oneDNN buffers; VmRSS also counts shared-library and
file pages, which the kernel drops under memory pressure). Writes every sample
to ``OUT/soak-<stamp>.csv`` and a plot beside it. ``--env`` sets variables for
the serve process and so for its replicas (e.g. to A/B an allocator setting).
"""

from __future__ import annotations

import argparse
import csv
import os
import random
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from bench.reference_data import DEFAULT_DATA_DIR
from embedserve.defaults.model_args import default_cache_dir
from embedserve.entrypoint import GATEWAY_LISTENING
from embedserve.launch.processes import popen_listening, stop_popen

ROOT = Path(__file__).resolve().parents[1]
# When the shared corpus is absent: words of several scripts, so the token mix is multilingual.
FALLBACK_WORDS = ("the quick brown fox jumps over a lazy dog Menschenwürde unantastbar "
                  "droits égaux dignité свобода равенство достоинство 人人生而自由 在尊严和权利上一律平等 "
                  "すべての人間は 生まれながらにして自由 كرامة الإنسان حقوق متساوية मानव अधिकार "
                  "स्वतंत्रता ελευθερία ισότητα 인간의 존엄성 sözleşme hürriyet").split()


def corpus_words(data_dir: Path) -> list[list[str]]:
    """Each UDHR language's words (a list per file); the fallback sample when absent."""
    files = sorted((data_dir / "text" / "udhr2").glob("*.txt"))
    languages = [f.read_text(errors="replace").split() for f in files]
    languages = [words for words in languages if len(words) >= 50]
    return languages or [FALLBACK_WORDS]


def random_batch(rng: random.Random, languages: list[list[str]]) -> list[str]:
    """1-32 texts of 3-400 consecutive words, each from a random language."""
    texts = []
    for _ in range(rng.randint(1, 32)):
        words = rng.choice(languages)
        count = rng.randint(3, 400)
        start = rng.randrange(max(1, len(words) - count))
        picked = words[start:start + count]
        while len(picked) < count:  # a short text: repeat it
            picked += words[:count - len(picked)]
        texts.append(" ".join(picked))
    return texts


def memory_mb(pid: int) -> tuple[float, float]:
    """(VmRSS, RssAnon) of ``pid`` in MB."""
    fields = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "RssAnon"):
            fields[key] = int(value.split()[0]) / 1024
    return fields["VmRSS"], fields["RssAnon"]


def children(pid: int) -> list[int]:
    """Direct children of ``pid`` (the replicas of a serve process), from /proc."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        # Field 4 (ppid) follows the parenthesised command name, which may hold spaces.
        if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
            found.append(int(entry.name))
    return sorted(found)


@dataclass
class Load:
    """Counters the client threads share (each increment under ``lock``)."""
    requests: int = 0
    texts: int = 0
    errors: int = 0
    error_kinds: dict[str, int] = field(default_factory=dict)   # status code or exception: count
    lock: threading.Lock = field(default_factory=threading.Lock)


def client(url: str, seed: int, languages: list[list[str]], stop: threading.Event, load: Load) -> None:
    rng = random.Random(seed)
    with httpx.Client(base_url=url, timeout=300) as http:
        while not stop.is_set():
            texts = random_batch(rng, languages)
            try:
                status = str(http.post("/v1/embeddings", json={"input": texts}).status_code)
            except httpx.HTTPError as exc:
                status = type(exc).__name__
            if stop.is_set():
                return  # cut off by the end of the run, not an error of the server
            with load.lock:
                load.requests += 1
                load.texts += len(texts)
                if status != "200":
                    load.errors += 1
                    load.error_kinds[status] = load.error_kinds.get(status, 0) + 1


def wait_ready(url: str, timeout_s: float = 600.0) -> None:
    deadline = time.monotonic() + timeout_s
    while httpx.get(url + "/ready", timeout=10).status_code != 200:
        if time.monotonic() > deadline:
            raise RuntimeError(f"{url} never became ready")
        time.sleep(0.5)


def slope_mb_per_min(samples: list[tuple[float, float]]) -> float:
    """Least-squares slope of (seconds, MB) samples, in MB per minute."""
    if len(samples) < 2:
        return 0.0
    n = len(samples)
    mean_t = sum(t for t, _ in samples) / n
    mean_m = sum(m for _, m in samples) / n
    var = sum((t - mean_t) ** 2 for t, _ in samples)
    cov = sum((t - mean_t) * (m - mean_m) for t, m in samples)
    return 60.0 * cov / var if var else 0.0


def summarize(rows: list[dict], warmup_s: float, duration_s: float) -> list[dict]:
    """Per process: warm-up, final and max RSS, their ratio, and the last half's slope."""
    out = []
    for role in dict.fromkeys(row["role"] for row in rows):
        series = [(row["t_s"], row["rss_mb"], row["anon_mb"]) for row in rows if row["role"] == role]
        after_warmup = [s for s in series if s[0] >= warmup_s] or series
        warm = after_warmup[0]
        final = series[-1]
        half = warmup_s + (duration_s - warmup_s) / 2
        last_half = [(t, m) for t, m, _ in series if t >= half]
        out.append({"role": role, "warmup_mb": warm[1], "final_mb": final[1],
                    "max_mb": max(m for _, m, _ in series), "ratio": final[1] / warm[1],
                    "slope_mb_min": slope_mb_per_min(last_half),
                    "warmup_anon_mb": warm[2], "final_anon_mb": final[2],
                    "anon_slope_mb_min": slope_mb_per_min([(t, a) for t, _, a in series if t >= half])})
    return out


def write_plot(rows: list[dict], path: Path, title: str) -> bool:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    fig, ax = plt.subplots(figsize=(8, 4.5))
    for role in dict.fromkeys(row["role"] for row in rows):
        series = [row for row in rows if row["role"] == role]
        ax.plot([r["t_s"] / 60 for r in series], [r["rss_mb"] for r in series], label=role)
    ax.set_xlabel("minutes of traffic")
    ax.set_ylabel("VmRSS (MB)")
    ax.set_title(title, fontsize=9)
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench soak", description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, default=None)
    parser.add_argument("--replicas", type=int, default=2)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--interval", type=float, default=5.0, help="seconds between RSS samples")
    parser.add_argument("--warmup", type=float, default=60.0,
                        help="seconds of traffic after which the 'warm-up' RSS is read")
    parser.add_argument("--env", action="append", default=[], metavar="KEY=VALUE",
                        help="environment for serve and its replicas (repeatable)")
    parser.add_argument("--serve-arg", action="append", default=[], metavar="ARG",
                        help="extra argument for embedserve serve (repeatable; use --serve-arg=--flag)")
    parser.add_argument("--pythonpath", default=None, help="run serve on another checkout's code")
    parser.add_argument("--data-dir", type=Path, default=DEFAULT_DATA_DIR)
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "out")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    model = args.model or default_cache_dir() / "multilingual-e5-small"
    languages = corpus_words(args.data_dir)
    source = f"udhr2 ({len(languages)} languages)" if languages[0] is not FALLBACK_WORDS else "generated sample"
    extra_env = dict(item.split("=", 1) for item in args.env)
    checkout = args.pythonpath or str(ROOT)
    env = dict(os.environ, PYTHONPATH=checkout, PYTHONUNBUFFERED="1", **extra_env)
    argv_serve = [sys.executable, "-m", "embedserve.cli", "serve", "--model", str(model), "--port", "0",
                  "--replicas", str(args.replicas), "--auto-truncate", "right", *args.serve_arg]
    duration_s = args.minutes * 60
    process, banner = popen_listening(argv_serve, GATEWAY_LISTENING, env=env, cwd=checkout)
    rows: list[dict] = []
    load = Load()
    stop = threading.Event()
    threads: list[threading.Thread] = []
    try:
        url = banner.group(1)
        wait_ready(url)
        replicas = children(process.pid)
        pids = {"serve (gateway)": process.pid, **{f"replica {i}": pid for i, pid in enumerate(replicas)}}
        print(f"soak: {url}, pids {pids}, {args.clients} clients for {args.minutes:g} min, "
              f"texts from {source}, env {extra_env or '{}'}", flush=True)
        for role, pid in pids.items():
            rss, anon = memory_mb(pid)
            rows.append({"t_s": -1.0, "role": role, "pid": pid, "rss_mb": rss, "anon_mb": anon})
        threads = [threading.Thread(target=client, args=(url, args.seed * 1000 + i, languages, stop, load),
                                    daemon=True) for i in range(args.clients)]
        started = time.monotonic()
        for thread in threads:
            thread.start()
        while (now := time.monotonic() - started) < duration_s:
            for role, pid in pids.items():
                rss, anon = memory_mb(pid)
                rows.append({"t_s": round(now, 1), "role": role, "pid": pid, "rss_mb": rss, "anon_mb": anon})
            if len(rows) % (len(pids) * 12) == 0:
                print(f"soak: {now / 60:.1f} min, {load.requests} requests, {load.errors} errors, "
                      + ", ".join(f"{r['role']} {r['rss_mb']:.0f} MB" for r in rows[-len(pids):]), flush=True)
            time.sleep(args.interval)
        for role, pid in pids.items():
            rss, anon = memory_mb(pid)
            rows.append({"t_s": round(time.monotonic() - started, 1), "role": role, "pid": pid,
                         "rss_mb": rss, "anon_mb": anon})
    finally:
        stop.set()
        for thread in threads:
            thread.join(timeout=300)
        stop_popen(process, 60)
    elapsed = max(row["t_s"] for row in rows)
    table = summarize([row for row in rows if row["t_s"] >= 0], args.warmup, elapsed)
    load_avg = os.getloadavg()
    print(f"\n{load.requests} requests ({load.texts} texts, {load.texts / elapsed:.1f} texts/s), "
          f"{load.errors} errors {load.error_kinds or ''} in {elapsed / 60:.1f} min; "
          f"load average {load_avg[0]:.2f} {load_avg[1]:.2f} {load_avg[2]:.2f}; env {extra_env or '{}'}")
    print("| process | RSS at start | after warm-up | final | max | final / warm-up | last-half slope "
          "| anonymous: warm-up → final, slope |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    start_rss = {row["role"]: row["rss_mb"] for row in rows if row["t_s"] < 0}
    for line in table:
        print(f"| {line['role']} | {start_rss[line['role']]:.0f} MB | {line['warmup_mb']:.0f} MB | "
              f"{line['final_mb']:.0f} MB | {line['max_mb']:.0f} MB | {line['ratio']:.2f} | "
              f"{line['slope_mb_min']:+.1f} MB/min | {line['warmup_anon_mb']:.0f} → {line['final_anon_mb']:.0f} MB, "
              f"{line['anon_slope_mb_min']:+.1f} MB/min |")
    args.out.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    csv_path = args.out / f"soak-{stamp}.csv"
    with open(csv_path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=["t_s", "role", "pid", "rss_mb", "anon_mb"])
        writer.writeheader()
        writer.writerows(rows)
    title = (f"serve --replicas {args.replicas}, {args.clients} clients, {elapsed / 60:.1f} min, "
             f"env {extra_env or '{}'}")
    plotted = write_plot(rows, csv_path.with_suffix(".png"), title)
    print(f"samples: {csv_path}" + (f", plot: {csv_path.with_suffix('.png')}" if plotted else ""))
    return 1 if load.errors else 0


if __name__ == "__main__":
    sys.exit(main())
