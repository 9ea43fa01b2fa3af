"""GPU check of the engine's CUDA path: correctness first, then latency and throughput.

Prepared for a session that is lent a GPU (none was lent when it was written,
so it has not run yet). One script, about 2 minutes on an H100-class GPU:

1. replay vs eager: the same batches through a graph engine (eager, capture,
   replay) and an eager-only engine give equal outputs; fp32 CUDA vs the CPU
   engine agree to 1e-4; graph counters show captures and replays.
2. batch-1 latency at 128 and 512 tokens, eager vs graph replay (target:
   replay <= 0.5x eager at 128).
3. throughput at a 512-token budget: mixed-length batches packed up to 512
   tokens, 8 steps in flight, eager vs graphs.

    .venv/bin/python bench/gpu_engine.py [--out results.json]

Exit status 1 if a correctness check fails. Prints one JSON document.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np


def sequences(rng: np.random.Generator, lengths: list[int]) -> list[np.ndarray]:
    return [np.r_[0, rng.integers(4, 250000, size=n - 2), 2].astype(np.int32) for n in lengths]


def pack_to_budget(rng: np.random.Generator, budget: int, count: int) -> list[list[np.ndarray]]:
    batches, current, used = [], [], 0
    while len(batches) < count:
        n = int(np.exp(rng.uniform(np.log(8), np.log(512))))
        if used + n > budget and current:
            batches.append(current)
            current, used = [], 0
        current.append(sequences(rng, [n])[0])
        used += n
    return batches


def latency_ms(engine, batch, runs: int = 50) -> float:
    for _ in range(3):                                   # eager warm-up, capture, first replay
        engine.step(batch).wait()
    times = []
    for _ in range(runs):
        started = time.perf_counter()
        engine.step(batch).wait()
        times.append((time.perf_counter() - started) * 1e3)
    return statistics.median(times)


def throughput(engine, batches, Batch, in_flight: int = 8) -> float:
    for batch in batches:                                # warm every bucket up to replay
        engine.step(Batch.from_sequences(batch)).wait()
        engine.step(Batch.from_sequences(batch)).wait()
    started = time.perf_counter()
    pending, tokens = [], 0
    for batch in batches:
        pending.append(engine.step(Batch.from_sequences(batch)))
        tokens += sum(len(s) for s in batch)
        if len(pending) >= in_flight:
            pending.pop(0).wait()
    for lazy in pending:
        lazy.wait()
    return tokens / (time.perf_counter() - started)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--dtype", default="bfloat16")
    args = parser.parse_args(argv)

    import torch

    from embedserve.engine import Batch, Engine
    from embedserve.defaults.build import ensure_default_model
    from embedserve.defaults.model_args import default_cache_dir

    if not torch.cuda.is_available():
        print("no CUDA device", file=sys.stderr)
        return 2
    model_dir = ensure_default_model(default_cache_dir())
    rng = np.random.default_rng(0)
    results: dict[str, object] = {"device": torch.cuda.get_device_name(), "dtype": args.dtype,
                                  "torch": torch.__version__}
    ok = True

    graphs = Engine.load(model_dir, device="cuda", dtype=args.dtype)
    eager = Engine.load(model_dir, device="cuda", dtype=args.dtype, cuda_graphs=False)

    # 1. correctness
    checks = [Batch.from_sequences(sequences(rng, lengths))
              for lengths in ([5, 60, 300], [7, 50, 290], [128], [512], [8] * 40)]
    worst = 0.0
    for batch in checks:
        expected = eager.step(batch).wait()
        for _ in range(3):                               # eager, capture + replay, replay
            worst = max(worst, float(np.abs(graphs.step(batch).wait() - expected).max()))
    results["replay_vs_eager_max_abs"] = worst
    ok &= worst <= 1e-3 if args.dtype != "float32" else worst <= 1e-5
    with Engine.load(model_dir, device="cuda", dtype="float32") as cuda32, Engine.load(model_dir) as cpu:
        diff = max(float(np.abs(cuda32.step(b).wait() - cpu.step(b).wait()).max()) for b in checks)
    results["cuda_fp32_vs_cpu_fp32_max_abs"] = diff
    ok &= diff <= 1e-4
    results["graph_stats_after_checks"] = graphs.stats()
    ok &= graphs.stats()["replays"] > 0

    # 2. batch-1 latency
    for length in (128, 512):
        batch = Batch.from_sequences(sequences(rng, [length]))
        e, g = latency_ms(eager, batch), latency_ms(graphs, batch)
        results[f"latency_ms_{length}"] = {"eager": e, "replay": g, "replay_over_eager": g / e}

    # 3. throughput at a 512-token budget
    batches = pack_to_budget(rng, 512, 200)
    results["throughput_tokens_per_s_budget512"] = {
        "eager": throughput(eager, batches, Batch), "graphs": throughput(graphs, batches, Batch)}
    results["graph_stats"] = graphs.stats()
    results["checks_passed"] = bool(ok)
    graphs.close()
    eager.close()

    text = json.dumps(results, indent=2)
    print(text)
    if args.out:
        args.out.write_text(text)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
