"""``python -m bench gpu``: the four workloads at GPU sizes, engine against its peers.

For each model (random weights at a real checkpoint's shape, bench/gpu/models.py) and
each system, fed token ids directly:

- latency: one sequence of 128 / 512 / 2048 / 4096 tokens (where the model's
  positions allow), p50 and p99;
- scoring: 5 / 25 / 50 pairs of 512 tokens in one request (a cross-encoder);
- throughput: 100 x 512 tokens, and 200 sequences of mixed lengths (16 to 4096,
  log-uniform, capped at the model's positions), tokens/s;
- concurrency: 1 to 16 requests of 512 tokens arriving together, p50.

Systems: the engine with CUDA graphs and the varlen kernel (the default), graphs off,
the padded attention layouts; sentence-transformers in float16 at its best batch size;
``transformers`` with SDPA. The engine runs as a replica does: sequences packed
first-come-first-served into steps of ``--step-tokens``, several steps in flight.
Each result is one JSON line in ``--out``/gpu.jsonl, written as soon as it is measured,
so a run cut short still returns what it did. ``--device cpu --dry-run`` runs every
code path at tiny sizes on the CPU in seconds (the CI suite does, tests/test_gpu_run_dry.py).
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from bench.gpu.models import SHAPES, scaled_config, write_model

EMBEDDERS = ["multilingual-e5-small", "bge-base", "bge-m3", "qwen3-embedding-0.6b", "modernbert-base",
             "all-mpnet-base-v2"]
SCORERS = ["bge-reranker-base"]
LATENCY_LENGTHS = (128, 512, 2048, 4096)
SCORING_PAIRS = (5, 25, 50)
CONCURRENCY = (1, 2, 4, 8, 16)
REFERENCE_BATCH_SIZES = (16, 32, 64, 128)


class Results:
    """JSON lines appended to one file, flushed as they come."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self._file = path.open("a")

    def write(self, **row: Any) -> None:
        row["time"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        self._file.write(json.dumps(row) + "\n")
        self._file.flush()
        print(json.dumps(row), flush=True)


def percentiles(times_ms: Sequence[float]) -> dict[str, float]:
    ordered = sorted(times_ms)
    return {"p50_ms": statistics.median(ordered),
            "p99_ms": ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]}


def random_sequences(rng: np.random.Generator, lengths: Sequence[int], vocab: int) -> list[np.ndarray]:
    return [rng.integers(3, vocab, size=int(n)).astype(np.int32) for n in lengths]


def pack_steps(sequences: Sequence[np.ndarray], step_tokens: int) -> list[list[np.ndarray]]:
    """First come, first served into steps of at most ``step_tokens`` (a longer sequence
    runs alone), as the scheduler's plan_batch packs them."""
    steps: list[list[np.ndarray]] = [[]]
    used = 0
    for sequence in sequences:
        if steps[-1] and used + len(sequence) > step_tokens:
            steps.append([])
            used = 0
        steps[-1].append(sequence)
        used += len(sequence)
    return [step for step in steps if step]


class EngineSystem:
    """An Engine run as a replica runs it: packed steps, ``in_flight`` at a time."""

    def __init__(self, name: str, engine: Any, batch_class: Any, step_tokens: int, in_flight: int = 8) -> None:
        self.name = name
        self.engine = engine
        self._batch = batch_class
        self.step_tokens = step_tokens
        self.in_flight = in_flight

    def run(self, sequences: Sequence[np.ndarray]) -> None:
        pending = []
        for step in pack_steps(sequences, self.step_tokens):
            pending.append(self.engine.step(self._batch.from_sequences(step, task=self.engine.info.task)))
            if len(pending) >= self.in_flight:
                pending.pop(0).wait()
        for lazy in pending:
            lazy.wait()

    def extra(self) -> dict[str, Any]:
        stats = self.engine.stats()
        return {key: stats.get(key) for key in ("captures", "replays", "eager_runs", "evictions", "graphs",
                                                "graph_bytes", "varlen_attention")}

    def close(self) -> None:
        self.engine.close()


class PaddedSystem:
    """A peer fed padded batches (bench/gpu/references.py)."""

    def __init__(self, name: str, forward: Any, device: str, batch_size: int | None = None) -> None:
        self.name = name
        self._forward = forward
        self._device = device
        self.batch_size = batch_size or REFERENCE_BATCH_SIZES[1]

    def run(self, sequences: Sequence[np.ndarray], batch_size: int | None = None) -> None:
        from bench.gpu.references import run_padded

        run_padded(self._forward, sequences, batch_size or min(self.batch_size, len(sequences)), self._device)

    def extra(self) -> dict[str, Any]:
        return {"batch_size": self.batch_size}

    def close(self) -> None:
        self._forward = None


def timed(run: Callable[[], None], device: str) -> float:
    """Seconds ``run`` takes, the device's queue drained before and after."""
    import torch

    if device.startswith("cuda"):
        torch.cuda.synchronize()
    started = time.perf_counter()
    run()
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    return time.perf_counter() - started


def memory(device: str) -> dict[str, float]:
    import torch

    if not device.startswith("cuda"):
        return {}
    return {"reserved_mib": torch.cuda.memory_reserved() / 2**20,
            "max_reserved_mib": torch.cuda.max_memory_reserved() / 2**20}


def build_systems(model_dir: Path, name: str, device: str, dry_run: bool, step_tokens: int) -> list[Any]:
    import torch

    from bench.gpu.references import sentence_transformers_forward, transformers_sdpa_forward
    from embedserve.engine import Batch, Engine
    from embedserve.model.cuda_options import CudaOptions

    shape = SHAPES[name]
    half = "float32" if device == "cpu" else None            # None: the device's default (bf16 where it runs)
    systems: list[Any] = []
    if device.startswith("cuda"):
        variants = {"embedserve": CudaOptions(graph_tokens=step_tokens),
                    "embedserve-padded": CudaOptions(attention="padded", graph_tokens=step_tokens)}
        for label, options in variants.items():
            systems.append(EngineSystem(label, Engine.load(model_dir, device=device, dtype=half, cuda=options),
                                        Batch, step_tokens))
        systems.append(EngineSystem("embedserve-nographs", Engine.load(model_dir, device=device, dtype=half,
                                                                       cuda_graphs=False), Batch, step_tokens))
    else:
        systems.append(EngineSystem("embedserve", Engine.load(model_dir, device=device, dtype=half), Batch,
                                    step_tokens, in_flight=1))
    reference_dtype = torch.float16 if device.startswith("cuda") else torch.float32
    systems.append(PaddedSystem("sentence-transformers-fp16" if device != "cpu" else "sentence-transformers",
                                sentence_transformers_forward(model_dir, device, reference_dtype, shape.task),
                                device))
    systems.append(PaddedSystem("transformers-sdpa", transformers_sdpa_forward(
        model_dir, device, reference_dtype, shape.task, shape.pooling), device))
    return systems


def tune_batch_size(system: PaddedSystem, sequences: list[np.ndarray], device: str, dry_run: bool) -> None:
    """The peer's best batch size on this workload's sequences (tokens/s), kept for the rest."""
    best, best_rate = system.batch_size, 0.0
    for size in REFERENCE_BATCH_SIZES[:1] if dry_run else REFERENCE_BATCH_SIZES:
        system.run(sequences[:size], size)                   # warm-up of this shape
        seconds = timed(lambda: system.run(sequences, size), device)
        rate = sum(len(s) for s in sequences) / seconds
        if rate > best_rate:
            best, best_rate = size, rate
    system.batch_size = best


def measure_model(name: str, directory: Path, device: str, dry_run: bool, step_tokens: int,
                  results: Results, deadline: float) -> None:
    shape = SHAPES[name]
    config = scaled_config(shape, "tiny" if dry_run else "real")
    vocab, positions = config["vocab_size"], config["max_position_embeddings"]
    max_length = positions - 2 if "Roberta" in shape.config_class else positions
    rng = np.random.default_rng(0)
    runs = 2 if dry_run else 30
    systems = build_systems(directory, name, device, dry_run, step_tokens)
    base = {"model": name, "device": device, "step_tokens": step_tokens}
    try:
        for system in systems:
            if isinstance(system, PaddedSystem):
                tune_batch_size(system, random_sequences(rng, [512 if not dry_run else 16]
                                                         * (128 if not dry_run else 16), vocab), device, dry_run)

        def record(workload: str, system: Any, **values: Any) -> None:
            results.write(**base, workload=workload, system=system.name, **values, **system.extra(),
                          **memory(device))

        if shape.task == "embed":
            for length in LATENCY_LENGTHS if not dry_run else (8, 16):
                if length > max_length or time.monotonic() > deadline:
                    continue
                sequence = random_sequences(rng, [length], vocab)
                for system in systems:
                    for _ in range(3):                       # eager, capture, first replay
                        system.run(sequence) if isinstance(system, EngineSystem) else system.run(sequence, 1)
                    times = [timed(lambda: system.run(sequence) if isinstance(system, EngineSystem)
                                   else system.run(sequence, 1), device) * 1e3 for _ in range(runs)]
                    record("latency", system, tokens=length, **percentiles(times))
            workloads = {"throughput-100x512": random_sequences(rng, [min(512, max_length)]
                                                                * (100 if not dry_run else 6), vocab),
                         "mixed-16-4096": random_sequences(
                             rng, np.exp(rng.uniform(np.log(16), np.log(min(4096, max_length)),
                                                     200 if not dry_run else 8)).astype(int), vocab)}
            for workload, sequences in workloads.items():
                if time.monotonic() > deadline:
                    break
                tokens = sum(len(s) for s in sequences)
                for system in systems:
                    system.run(sequences)                    # warm-up: every bucket to replay
                    system.run(sequences)
                    seconds = min(timed(lambda: system.run(sequences), device) for _ in range(2 if not dry_run else 1))
                    record(workload, system, tokens=tokens, tokens_per_s=tokens / seconds)
            for clients in CONCURRENCY if not dry_run else (1, 2):
                if time.monotonic() > deadline:
                    break
                sequences = random_sequences(rng, [min(512, max_length)] * clients, vocab)
                for system in systems:
                    system.run(sequences)
                    times = [timed(lambda: system.run(sequences), device) * 1e3 for _ in range(max(3, runs // 3))]
                    record("concurrency", system, clients=clients, **percentiles(times))
        else:
            for pairs in SCORING_PAIRS if not dry_run else (2,):
                if time.monotonic() > deadline:
                    break
                sequences = random_sequences(rng, [min(512, max_length)] * pairs, vocab)
                for system in systems:
                    for _ in range(2):
                        system.run(sequences)
                    times = [timed(lambda: system.run(sequences), device) * 1e3 for _ in range(runs)]
                    record("scoring", system, pairs=pairs, **percentiles(times))
    finally:
        for system in systems:
            system.close()


def environment(device: str) -> dict[str, Any]:
    import torch

    info: dict[str, Any] = {"python": platform.python_version(), "torch": torch.__version__,
                            "host": platform.node(), "processor": platform.processor() or platform.machine()}
    if device.startswith("cuda"):
        info.update(gpu=torch.cuda.get_device_name(), capability=list(torch.cuda.get_device_capability()),
                    gpu_memory_gib=torch.cuda.get_device_properties(0).total_memory / 2**30)
    for package in ("transformers", "sentence_transformers", "numba", "numpy"):
        try:
            info[package] = __import__(package).__version__
        except ImportError:
            info[package] = None
    return info


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench gpu", description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda", help="cuda (default) or cpu (with --dry-run)")
    parser.add_argument("--dry-run", action="store_true", help="tiny shapes, few runs: every code path in seconds")
    parser.add_argument("--out", type=Path, default=Path("bench/out/gpu"), help="folder for gpu.jsonl")
    parser.add_argument("--models", default=",".join(EMBEDDERS + SCORERS),
                        help=f"comma-separated, from: {', '.join(SHAPES)}")
    parser.add_argument("--step-tokens", type=int, default=None,
                        help="the replica's step budget (default: the scheduler's default for the device)")
    parser.add_argument("--budget-s", type=float, default=420, help="stop starting new workloads after this")
    args = parser.parse_args(argv)
    import torch

    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print(f"bench gpu: torch {torch.__version__} sees no CUDA device", file=sys.stderr)
        return 2
    from embedserve.scheduler.settings import default_max_batch_tokens

    step_tokens = args.step_tokens or default_max_batch_tokens(args.device)
    deadline = time.monotonic() + args.budget_s
    results = Results(args.out / "gpu.jsonl")
    results.write(workload="environment", **environment(args.device))
    scale = "tiny" if args.dry_run else "real"
    with tempfile.TemporaryDirectory(prefix="embedserve-gpu-models-") as scratch:
        for name in [m for m in args.models.split(",") if m]:
            if time.monotonic() > deadline:
                results.write(workload="skipped", model=name, reason="time budget spent")
                continue
            started = time.monotonic()
            directory = write_model(Path(scratch) / name, name, scale,
                                    device="cuda" if args.device.startswith("cuda") else "cpu")
            results.write(workload="model-written", model=name, scale=scale, seconds=time.monotonic() - started)
            try:
                measure_model(name, directory, args.device, args.dry_run, step_tokens, results, deadline)
            except Exception as error:           # one model's failure must not cost the others' figures
                results.write(workload="failed", model=name, error=f"{type(error).__name__}: {error}")
                if args.dry_run:
                    raise
    return 0
