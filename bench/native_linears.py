"""The fused layers' linears on a native kernel against oneDNN, alone and in the engine.

The kernel this CPU runs: float32 on the AVX2 kernel (``engine/avx2_linear.py``) where
AVX2 is the widest vector unit, bf16 on the AVX512-BF16 kernel
(``engine/bf16_linear.py``) where the CPU has AVX512-BF16 but no AMX, bf16 calls of up to
64 rows on the AMX kernel (``engine/amx_linear.py``) where it has AMX (oneDNN keeps the
larger calls there: above 64 tokens both contenders are oneDNN).
``python -m bench native_linears`` prints two tables:

- the 48 linears of one multilingual-e5-small step (12 layers of QKV 1152 x 384,
  output 384 x 384, feed-forward 1536 x 384 with its GELU and 384 x 1536; distinct
  weights, so they stream through the caches as a step's do) at several token counts:
  ``PackedWeight`` on the kernel against ``PackedWeight`` on oneDNN (GELU in the
  epilogue of both), the same weights, calls alternating, median wall time and GFLOP/s;
- whole steps of the default model, an engine on the kernel against one on oneDNN
  (``Engine.load(native_linears=False)``), each step as a replica runs it: with the
  kernel a step of up to 64 tokens is not padded to a token bucket (cpu_shapes.py),
  with oneDNN 20 tokens run as 24; with the lowest cosine between the two engines'
  embeddings.

Only where one of the kernels runs (and a build with it).
"""

from __future__ import annotations

import argparse

import numpy as np

from bench.native_kernels import alternating_medians, min_cosine

LAYERS = 12
HIDDEN, INTERMEDIATE = 384, 1536


def linears_table(repeats: int, threads: int, dtype: str) -> None:
    import torch
    from torch import nn

    from embedserve.engine.onednn import PackedWeight

    torch.manual_seed(0)
    torch.set_num_threads(threads)
    shapes = [(HIDDEN, 3 * HIDDEN, "none"), (HIDDEN, HIDDEN, "none"), (HIDDEN, INTERMEDIATE, "gelu"),
              (INTERMEDIATE, HIDDEN, "none")]
    torch_dtype = getattr(torch, dtype)
    linears = [(nn.Linear(i, o).to(torch_dtype), i, attr) for _ in range(LAYERS) for i, o, attr in shapes]
    packed = {native: [(PackedWeight(linear, native, few_rows=native), width, attr) for linear, width, attr in linears]
              for native in (True, False)}
    assert all(p.native or p.few_rows for p, _, _ in packed[True])
    assert not any(p.native or p.few_rows for p, _, _ in packed[False])
    macs_per_token = LAYERS * sum(i * o for i, o, _ in shapes)
    print(f"| tokens | kernel ms | oneDNN ms | oneDNN / kernel | kernel GFLOP/s | oneDNN GFLOP/s |"
          f"  ({len(linears)} linears, {threads} threads)")
    print("|---:|---:|---:|---:|---:|---:|")
    for tokens in (1, 8, 16, 20, 32, 64, 128, 256, 512):
        inputs = {width: torch.randn(tokens, width).to(torch_dtype) for width in (HIDDEN, INTERMEDIATE)}

        def step(native: bool) -> None:
            for weight, width, attr in packed[native]:
                weight(inputs[width], attr, "none" if attr == "gelu" else "")

        step(True), step(False)                                     # warm-up
        median = alternating_medians({"kernel": lambda: step(True), "oneDNN": lambda: step(False)},
                                     repeats if tokens <= 128 else max(5, repeats // 4))
        ours, theirs = median["kernel"], median["oneDNN"]
        flops = 2 * macs_per_token * tokens
        print(f"| {tokens} | {ours * 1e3:.2f} | {theirs * 1e3:.2f} | {theirs / ours:.2f}x "
              f"| {flops / ours / 1e9:.0f} | {flops / theirs / 1e9:.0f} |", flush=True)


def engine_table(repeats: int, threads: int, dtype: str) -> None:
    import torch

    from embedserve.defaults.build import ensure_default_model
    from embedserve.defaults.model_args import default_cache_dir
    from embedserve.engine import Batch, Engine

    torch.set_num_threads(threads)
    rng = np.random.default_rng(0)
    model_dir = ensure_default_model(default_cache_dir())
    engines = {"kernel": Engine.load(model_dir, dtype=dtype),
               "oneDNN": Engine.load(model_dir, dtype=dtype, native_linears=False)}
    print(f"| default model, {dtype}, {threads} threads | tokens | kernel ms | oneDNN ms | oneDNN / kernel "
          "| min cosine |")
    print("|---|---:|---:|---:|---:|---:|")
    mixed = [int(n) for n in np.exp(rng.uniform(np.log(8), np.log(128), 8))]
    for name, lengths in (("1 x 16", [16]), ("1 x 20", [20]), ("1 x 64", [64]), ("4 x 16", [16] * 4),
                          ("1 x 128", [128]), ("mixed 8", mixed), ("1 x 512", [512]), ("32 x 512", [512] * 32)):
        batch = Batch.from_sequences([rng.integers(5, 200_000, n).astype(np.int32) for n in lengths])
        # The runner's own step, as a replica calls it (token buckets included).
        steps = {label: (lambda engine=engine: engine._runner._run(batch)) for label, engine in engines.items()}
        cosine = min_cosine(*(step() for step in steps.values()))  # also the warm-up
        median = alternating_medians(steps, repeats if sum(lengths) <= 128 else max(5, repeats // 4))
        ours, theirs = median["kernel"], median["oneDNN"]
        print(f"| {name} | {sum(lengths)} | {ours * 1e3:.2f} | {theirs * 1e3:.2f} | {theirs / ours:.2f}x "
              f"| {cosine:.7f} |", flush=True)
    for engine in engines.values():
        engine.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench native_linears", description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=41, help="timed calls per contender and size")
    args = parser.parse_args(argv)

    from embedserve.engine import amx_linear, avx2_linear, bf16_linear

    if avx2_linear.kernel_available():
        dtype = "float32"
    elif bf16_linear.kernel_available() or amx_linear.kernel_available():
        dtype = "bfloat16"
    else:
        print("no native linear runs here: not built, or this CPU has AVX-512 without BF16 "
              "(oneDNN keeps every call)")
        return 0
    print(f"native linear: {dtype}{' (AMX, calls of up to 64 rows)' if amx_linear.kernel_available() else ''}")
    linears_table(args.repeats, args.threads, dtype)
    print()
    engine_table(args.repeats, args.threads, dtype)
    return 0
