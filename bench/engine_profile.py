"""Where an engine step's CPU time goes, by kind of work, in fp32 and bf16.

Runs the default model (multilingual-e5-small) through ``Engine`` on one
batch (32 x 512 random ids by default, a mixed-length batch, or one 20-token query) under
``torch.profiler`` and sums each op's self time into the kinds of work a
transformer layer does: dense matmuls (oneDNN, AMX in bf16, or the native AVX2 kernel
in float32 on CPUs without AVX-512), attention (SDPA, or
the native kernel in bf16: AMX tiles or VDPBF16PS),
layer norms, residual adds, copies and dtype conversions, the rest. For the
matmuls and attention it also gives the achieved GFLOP/s and the fraction of
the CPU's peak for that dtype, computed from the clock (``--ghz``, default
the ``cpu MHz`` the kernel reports) and per-core FLOP/cycle:

- fp32: two AVX-512 FMA units x 16 lanes x 2 = 64 FLOP/cycle;
- bf16 on AMX: TDPBF16PS does 16 x 16 x 32 multiply-adds (16,384 FLOP) every
  16 cycles = 1,024 FLOP/cycle (Sapphire / Emerald Rapids);
- bf16 without AMX (AVX512-BF16): VDPBF16PS, 2 units x 32 pairs x 2 = 128.
  An upper bound: AMD Zen 4 runs 512-bit ops as two 256-bit halves, and a
  loop of independent VDPBF16PS measured 228 GFLOP/s per core on a 2.6 GHz
  (nominal) Zen 4, not 332 (BENCHMARKS.md, engine section): give such a measured
  rate with ``--peak`` (GFLOP/s per core), which replaces clock x FLOP/cycle.

Steps run in this thread (no worker hop), so the profiler sees every op. Use
``--threads 1`` on a shared machine: one thread's op times are not stretched
by waiting for a descheduled partner thread at OpenMP barriers.

    python -m bench engine_profile [--threads 1] [--batch uniform512|mixed|query] [--dtypes float32,bfloat16]
                                   [--peak GFLOPS]
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import defaultdict
from pathlib import Path

import numpy as np

BATCH = 32
# One search query: the overhead bench's sentence is 20 tokens with its specials.
QUERY_TOKENS = 20
# torch op (self time) -> kind of work; anything else is "other".
KINDS = {
    "mkldnn::_linear_pointwise": "dense matmuls",
    "aten::addmm": "dense matmuls",
    "aten::mm": "dense matmuls",
    "aten::_scaled_dot_product_flash_attention_for_cpu": "attention",
    "aten::scaled_dot_product_attention": "attention",
    "aten::_scaled_dot_product_attention_math": "attention",
    # the native kernels are no torch ops; they name themselves to the profiler
    # (embedserve/engine/profiler_names.py)
    "embedserve::avx2_linear": "dense matmuls",
    "embedserve::bf16_linear": "dense matmuls",
    "embedserve::amx_linear": "dense matmuls",
    "embedserve::int8_linear": "dense matmuls",
    "onednn::qlinear_pointwise": "dense matmuls",
    "aten::gelu_": "GELU (after a native linear)",
    "embedserve::bf16_attention": "attention",
    "embedserve::add_layer_norm": "layer norm (with the residual add)",
    "aten::native_layer_norm": "layer norm",
    "aten::add_": "residual / embedding adds",
    "aten::add": "residual / embedding adds",
    "aten::gelu": "GELU (unfused)",
    "aten::copy_": "copies and dtype conversions",
    "aten::_to_copy": "copies and dtype conversions",
    "aten::to": "copies and dtype conversions",
}
FLOP_PER_CYCLE = {"float32": 64, "bfloat16_amx": 1024, "bfloat16_avx512": 128}


def cpu_ghz() -> float:
    """The clock the kernel reports (a VM reports the nominal one; turbo may be higher)."""
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("cpu MHz"):
            return float(line.split(":")[1]) / 1000
    return float("nan")


def has_amx() -> bool:
    return "amx_bf16" in Path("/proc/cpuinfo").read_text()


def batch_lengths(name: str, seed: int = 0) -> list[int]:
    if name == "uniform512":
        return [512] * BATCH
    if name == "query":
        return [QUERY_TOKENS]
    rng = np.random.default_rng(seed)
    return np.exp(rng.uniform(np.log(8), np.log(512), BATCH)).astype(int).tolist()


def flops(config, lengths: list[int]) -> dict[str, float]:
    """Multiply-add FLOPs of one step: dense layers per token, attention per sequence."""
    h, inter, layers = config.hidden_size, config.intermediate_size, config.num_layers
    dense = 2 * (h * 3 * h + h * h + 2 * h * inter) * sum(lengths) * layers
    attention = sum(4 * n * n * h for n in lengths) * layers       # Q K^T and P V
    return {"dense matmuls": dense, "attention": attention}


def profile_step(runner, batch) -> dict[str, float]:
    """Seconds of self time per kind of work for one step."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        runner._run(batch)
    seconds: dict[str, float] = defaultdict(float)
    for event in prof.key_averages():
        seconds[KINDS.get(event.key, "other")] += event.self_cpu_time_total / 1e6
    return seconds


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--batch", choices=["uniform512", "mixed", "query"], default="uniform512")
    parser.add_argument("--dtypes", default="float32,bfloat16")
    parser.add_argument("--ghz", type=float, default=None, help="clock for the peak (default: /proc/cpuinfo)")
    parser.add_argument("--repeats", type=int, default=3, help="timed steps per dtype (best counts)")
    parser.add_argument("--peak", type=float, default=None,
                        help="measured peak, GFLOP/s per core, in place of clock x FLOP/cycle (one dtype)")
    args = parser.parse_args(argv)
    if args.peak is not None and "," in args.dtypes:
        parser.error("--peak is one dtype's peak: give one --dtypes")

    import torch

    from embedserve.defaults.build import ensure_default_model
    from embedserve.defaults.model_args import default_cache_dir
    from embedserve.engine import Batch, Engine

    torch.set_num_threads(args.threads)
    ghz = args.ghz or cpu_ghz()
    model_dir = ensure_default_model(default_cache_dir())
    rng = np.random.default_rng(0)
    lengths = batch_lengths(args.batch)
    batch = Batch.from_sequences([rng.integers(5, 200_000, n).astype(np.int32) for n in lengths])
    tokens = sum(lengths)
    print(f"{args.batch}: {len(lengths)} sequences, {tokens} tokens; threads={args.threads}; "
          f"clock {ghz:.2f} GHz; AMX {'yes' if has_amx() else 'no'}")
    for dtype in args.dtypes.split(","):
        engine = Engine.load(model_dir, dtype=dtype)
        runner = engine._runner
        runner._run(batch)                                   # warm-up: oneDNN primitives, allocator
        best = float("inf")
        for _ in range(args.repeats):
            started = time.thread_time() if args.threads == 1 else time.perf_counter()
            runner._run(batch)
            ended = time.thread_time() if args.threads == 1 else time.perf_counter()
            best = min(best, ended - started)
        seconds = profile_step(runner, batch)
        total = sum(seconds.values())
        work = flops(engine.config, lengths)
        kind = dtype if dtype == "float32" else ("bfloat16_amx" if has_amx() else "bfloat16_avx512")
        per_core = args.peak * 1e9 if args.peak else FLOP_PER_CYCLE[kind] * ghz * 1e9
        peak = per_core * args.threads
        step_flops = sum(work.values())
        print(f"\n{dtype}: {tokens / best:,.0f} tokens/s ({'thread CPU time' if args.threads == 1 else 'wall'}, "
              f"best of {args.repeats}); whole step {step_flops / best / 1e9:.0f} GFLOP/s = "
              f"{step_flops / best / peak:.1%} of {peak / 1e9:.0f} GFLOP/s peak ({kind})")
        print("| kind of work | share of profiled time | GFLOP/s | of peak |")
        print("|---|---:|---:|---:|")
        for name, spent in sorted(seconds.items(), key=lambda item: -item[1]):
            # profiled op times are stretched alike by the profiler; scale them onto the timed step
            scaled = spent / total * best
            rate = work.get(name, 0.0) / scaled / 1e9 if name in work and scaled else None
            rate_cells = f"{rate:,.0f} | {rate * 1e9 / peak:.1%}" if rate else " | "
            print(f"| {name} | {spent / total:.1%} | {rate_cells} |")
        engine.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
