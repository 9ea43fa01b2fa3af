"""The engine's native bf16 kernels against the torch ops they replace, alone and in the engine.

``python -m bench native_kernels`` prints three tables:

- attention alone, one layer's worth ([T, 12, head_dim] bf16 views of a fused QKV,
  as the engine has them): the kernel vs torch's flash SDPA called per sequence
  (what ``per_sequence`` ran before), single-thread CPU time (``time.thread_time``,
  less sensitive to other load) and wall time on the benchmark's thread count;
- whole bf16 steps of the default model (multilingual-e5-small): ``per_sequence``
  (kernel) vs ``per_sequence_sdpa``, the same weights, calls alternating step by step,
  with the lowest cosine between their embeddings;
- the same steps with the residual add + LayerNorm in one native pass
  (``engine/residual_norm.py``) vs torch's ``add_`` and LayerNorm, switched per step
  on the same engine.

Random token ids; lengths: uniform (32 x 512, 1 x 512, 1 x 16) and mixed (32
sequences, log-uniform 8..512 as in ``bench engine``).
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import numpy as np

HEADS = 12


def shapes(rng: np.random.Generator, quick: bool) -> dict[str, list[int]]:
    if quick:
        return {"4 x 128": [128] * 4, "mixed 8": [int(n) for n in np.exp(rng.uniform(np.log(8), np.log(512), 8))]}
    return {"32 x 512": [512] * 32,
            "mixed 32": [int(n) for n in np.exp(rng.uniform(np.log(8), np.log(512), 32))],
            "1 x 512": [512],
            "1 x 16": [16]}


def timed(run: Callable[[], object], clock: Callable[[], float]) -> float:
    started = clock()
    run()
    return clock() - started


def alternating_medians(runs: dict[str, Callable[[], object]], repeats: int) -> dict[str, float]:
    """Median wall seconds of each run, the runs called in turn so drifts hit all alike, in
    reversed order every other repeat (the first of a turn measured slower at 512 rows,
    the same call in both: 0.89-0.97x)."""
    times: dict[str, list[float]] = {name: [] for name in runs}
    for repeat in range(repeats):
        for name, run in (reversed(runs.items()) if repeat % 2 else runs.items()):
            times[name].append(timed(run, time.perf_counter))
    return {name: sorted(values)[len(values) // 2] for name, values in times.items()}


def min_cosine(a: np.ndarray, b: np.ndarray) -> float:
    """The lowest cosine between matching rows of ``a`` and ``b``."""
    return float(((a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)).min())


def attention_table(rng: np.random.Generator, repeats: int, threads: int, quick: bool) -> None:
    import torch
    import torch.nn.functional as F

    from embedserve.engine.modules import bf16_attention

    print("| head_dim | lengths | tokens | kernel CPU ms (1 thread) | SDPA CPU ms (1 thread) | SDPA / kernel "
          f"| kernel wall ms ({threads} threads) | SDPA wall ms | SDPA / kernel |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|")
    for head_dim in (32, 64):
        for name, lengths in shapes(rng, quick).items():
            qkv = torch.randn(sum(lengths), 3, HEADS, head_dim).to(torch.bfloat16)
            q, k, v = qkv[:, 0], qkv[:, 1], qkv[:, 2]
            starts = torch.from_numpy(np.r_[0, np.cumsum(lengths)[:-1]].astype(np.int64))
            lengths_tensor = torch.tensor(lengths, dtype=torch.int64)
            bounds = [(int(s), int(s) + n) for s, n in zip(starts, lengths)]

            def kernel() -> None:
                bf16_attention.attend_sequences(q, k, v, starts, lengths_tensor)

            def sdpa() -> None:
                out = torch.empty_like(q)
                for start, end in bounds:
                    qs, ks, vs = (t[start:end].transpose(0, 1).unsqueeze(0) for t in (q, k, v))
                    out[start:end] = F.scaled_dot_product_attention(qs, ks, vs)[0].transpose(0, 1)

            cells = []
            for count in (1, threads):
                torch.set_num_threads(count)
                clock = time.thread_time if count == 1 else time.perf_counter
                kernel(), sdpa()                                   # warm-up
                times = {"kernel": [], "sdpa": []}
                for _ in range(repeats):                           # alternate: drifts hit both alike
                    times["kernel"].append(timed(kernel, clock))
                    times["sdpa"].append(timed(sdpa, clock))
                ours, theirs = min(times["kernel"]), min(times["sdpa"])
                cells += [f"{ours * 1e3:.2f}", f"{theirs * 1e3:.2f}", f"{theirs / ours:.2f}x"]
            print(f"| {head_dim} | {name} | {sum(lengths)} | " + " | ".join(cells) + " |", flush=True)


def engine_ab(title: str, labels: tuple[str, str], steps: dict[str, Callable[[object], np.ndarray]],
              batches: dict[str, object], repeats: int) -> None:
    """Tokens/s of two ways to run the same steps, alternating call by call; median of ``repeats``."""
    ours, theirs = labels
    print(f"| {title} | tokens | {ours} tokens/s | {theirs} tokens/s | {ours} / {theirs} | min cosine |")
    print("|---|---:|---:|---:|---:|---:|")
    for name, batch in batches.items():
        outputs = {label: step(batch) for label, step in steps.items()}        # also the warm-up
        cosine = min_cosine(outputs[ours], outputs[theirs])
        median = alternating_medians({label: (lambda step=step: step(batch)) for label, step in steps.items()},
                                     repeats if batch.num_tokens > 64 else repeats * 10)
        rate = {label: batch.num_tokens / seconds for label, seconds in median.items()}
        print(f"| {name} | {batch.num_tokens} | {rate[ours]:,.0f} | {rate[theirs]:,.0f} "
              f"| {rate[ours] / rate[theirs]:.2f}x | {cosine:.6f} |", flush=True)


def engine_tables(rng: np.random.Generator, repeats: int, threads: int, quick: bool) -> None:
    import torch

    from embedserve.defaults.build import ensure_default_model
    from embedserve.defaults.model_args import default_cache_dir
    from embedserve.engine import Batch, Engine
    from embedserve.engine.residual_norm import ResidualNorm
    from embedserve.engine.runners.cpu import CpuRunner

    torch.set_num_threads(threads)
    engine = Engine.load(ensure_default_model(default_cache_dir()), dtype="bfloat16")
    batches = {name: Batch.from_sequences([rng.integers(5, 200_000, n).astype(np.int32) for n in lengths])
               for name, lengths in shapes(rng, quick).items()}
    runners = {name: CpuRunner(engine.model, engine.info, name) for name in ("per_sequence", "per_sequence_sdpa")}
    engine_ab(f"default model, bf16, {threads} threads", ("kernel", "SDPA"),
              {"kernel": runners["per_sequence"]._run, "SDPA": runners["per_sequence_sdpa"]._run}, batches, repeats)
    print()
    norms = [module for module in engine.model.modules() if isinstance(module, ResidualNorm)]
    native = all(norm.native for norm in norms)

    def with_norms(use_native: bool) -> Callable[[object], np.ndarray]:
        def step(batch: object) -> np.ndarray:
            for norm in norms:
                norm.native = use_native and native
            return runners["per_sequence"]._run(batch)
        return step

    engine_ab(f"add + LayerNorm, bf16, {threads} threads", ("one pass", "torch ops"),
              {"one pass": with_norms(True), "torch ops": with_norms(False)}, batches, repeats)
    for runner in runners.values():
        runner.close()
    engine.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench native_kernels", description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=5, help="timed calls per contender and size")
    parser.add_argument("--quick", action="store_true", help="small sizes (a smoke run)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)

    from embedserve.engine.modules import bf16_attention

    if not bf16_attention.kernel_available():
        print("the bf16 attention kernel is not available here (not built, or no AVX512-BF16 on this CPU)")
        return 2
    print(f"bf16 attention kernel path: {bf16_attention.kernel_path()}")
    rng = np.random.default_rng(args.seed)
    attention_table(rng, args.repeats, args.threads, args.quick)
    print()
    engine_tables(rng, args.repeats, args.threads, args.quick)
    return 0
