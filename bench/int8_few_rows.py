"""The int8 linears of few rows: the native kernel against oneDNN, and whole steps against bf16.

    python -m bench int8_few_rows [--threads 2] [--repeats 41]

``--dtype int8`` runs the encoder's QKV, attention-output and first feed-forward linears
on int8 weights (int8_layers.py). Calls of up to ``int8_linear.max_rows()`` rows go to the
native kernel (engine/int8_linear.py: it quantizes its bf16 input and multiplies with
AVX512-VNNI in one call), larger ones to oneDNN (the quantization pass, then
``qlinear_pointwise``). Two tables, each contender's calls alternating:

- the 36 int8 linears of one multilingual-e5-small step (12 layers; distinct weights, so
  they stream through the caches as a step's do) at several token counts: the kernel
  (on AMX-INT8 tiles where the CPU has them; then also its VNNI way, what a CPU without
  AMX runs) against oneDNN on the same weights (dynamic activations), and the same 36
  linears in bf16 (``PackedWeight``: the AMX or AVX512-BF16 kernel up to 64 rows, else
  oneDNN) for what int8 buys; over ``max_rows()`` the kernel column is oneDNN too;
- whole one-sequence steps of the default model as a replica runs them: int8 (static,
  calibrated) with the kernel (where it runs on VPDPBUSD, the second feed-forward linear
  too, per row), the same engine without the kernel (oneDNN's three int8 linears, that
  one in bf16), and bf16 (the default), with the lowest cosine of int8's embeddings to bf16's.

Only where the kernel runs (a build with it, a CPU with AVX512-VNNI and AVX512-BF16).
The engine table's steps of 65-128 tokens take the general path (padded to a bucket).
"""

from __future__ import annotations

import argparse
from unittest import mock

import numpy as np

from bench.native_kernels import alternating_medians, min_cosine
from bench.without_amx import add_option, apply

LAYERS = 12
HIDDEN, INTERMEDIATE = 384, 1536


def linears_table(repeats: int) -> None:
    import torch
    from torch import nn

    from embedserve.engine import int8_linear
    from embedserve.engine.int8_layers import Int8Weight
    from embedserve.engine.onednn import PackedWeight

    torch.manual_seed(0)
    shapes = [(HIDDEN, 3 * HIDDEN, "none"), (HIDDEN, HIDDEN, "none"), (HIDDEN, INTERMEDIATE, "gelu")]
    linears = [(nn.Linear(i, o), i, attr) for _ in range(LAYERS) for i, o, attr in shapes]
    int8 = [(Int8Weight(linear, None), width, attr) for linear, width, attr in linears]
    bf16 = [(PackedWeight(linear.to(torch.bfloat16), True, few_rows=True), width, attr)
            for linear, width, attr in linears]
    macs_per_token = LAYERS * sum(i * o for i, o, _ in shapes)
    tiles = int8_linear.tiles_available()
    print(f"int8 kernel: {'AMX-INT8 tiles' if tiles else 'AVX512-VNNI'}, calls of up to {int8_linear.max_rows()} "
          f"rows ({len(linears)} linears, {torch.get_num_threads()} threads)")
    print(f"| tokens | int8 kernel ms | {'VNNI ms | ' if tiles else ''}int8 oneDNN ms | oneDNN / kernel | bf16 ms "
          "| bf16 / int8 kernel | int8 kernel GOP/s |")
    print(f"|---:|---:|{'---:|' if tiles else ''}---:|---:|---:|---:|---:|")
    for tokens in (1, 8, 16, 32, 64, 128):
        inputs = {width: torch.randn(tokens, width).to(torch.bfloat16) for width in (HIDDEN, INTERMEDIATE)}

        def int8_step(kernel: bool) -> None:
            for weight, width, attr in int8:
                weight.few_rows = kernel
                weight(inputs[width], torch.bfloat16, attr, "none" if attr == "gelu" else "")

        def vnni_step() -> None:
            with mock.patch.object(int8_linear, "tiles_available", lambda: False):
                int8_step(True)

        def bf16_step() -> None:
            for weight, width, attr in bf16:
                weight(inputs[width], attr, "none" if attr == "gelu" else "")

        runs = {"kernel": lambda: int8_step(True), "oneDNN": lambda: int8_step(False), "bf16": bf16_step}
        if tiles:
            runs["VNNI"] = vnni_step
        for run in runs.values():                                    # warm-up
            run()
        median = alternating_medians(runs, repeats)
        ours = median["kernel"]
        vnni = f"{median['VNNI'] * 1e3:.2f} | " if tiles else ""
        print(f"| {tokens} | {ours * 1e3:.2f} | {vnni}{median['oneDNN'] * 1e3:.2f} | {median['oneDNN'] / ours:.2f}x "
              f"| {median['bf16'] * 1e3:.2f} | {median['bf16'] / ours:.2f}x "
              f"| {2 * macs_per_token * tokens / ours / 1e9:.0f} |", flush=True)


def engine_table(repeats: int) -> None:
    import torch

    from embedserve.defaults.build import ensure_default_model
    from embedserve.defaults.model_args import default_cache_dir
    from embedserve.engine import Batch, int8_linear
    from embedserve.scheduler.engine_loading import load_engine

    rng = np.random.default_rng(0)
    model_dir = ensure_default_model(default_cache_dir())
    engines = {"int8 kernel": load_engine(model_dir, dtype="int8")}
    with mock.patch.object(int8_linear, "kernel_available", lambda: False):   # an engine without it
        engines["int8 oneDNN"] = load_engine(model_dir, dtype="int8")
    engines["bf16"] = load_engine(model_dir, dtype="bfloat16")
    print(f"| default model, {torch.get_num_threads()} threads | int8 kernel ms | int8 oneDNN ms | oneDNN / kernel "
          "| bf16 ms | bf16 / int8 kernel | min cosine int8 to bf16 |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for tokens in (6, 20, 32, 64, 100, 200):
        batch = Batch.from_sequences([rng.integers(5, 200_000, tokens).astype(np.int32)])
        steps = {label: (lambda engine=engine: engine._runner._run(batch)) for label, engine in engines.items()}
        outputs = {label: step() for label, step in steps.items()}     # also the warm-up
        median = alternating_medians(steps, repeats)
        ours = median["int8 kernel"]
        print(f"| 1 x {tokens} | {ours * 1e3:.2f} | {median['int8 oneDNN'] * 1e3:.2f} "
              f"| {median['int8 oneDNN'] / ours:.2f}x | {median['bf16'] * 1e3:.2f} | {median['bf16'] / ours:.2f}x "
              f"| {min_cosine(outputs['int8 kernel'], outputs['bf16']):.5f} |", flush=True)
    for engine in engines.values():
        engine.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench int8_few_rows", description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=41, help="timed calls per contender and size")
    add_option(parser)
    args = parser.parse_args(argv)

    apply(args)
    import torch

    from embedserve.engine import int8_linear

    if not int8_linear.kernel_available():
        print("the int8 few-row kernel does not run here: not built, or no AVX512-VNNI / AVX512-BF16")
        return 0
    torch.set_num_threads(args.threads)
    linears_table(args.repeats)
    print()
    engine_table(args.repeats)
    return 0
