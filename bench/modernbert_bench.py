"""CPU benchmark: a ModernBERT-shaped model, Engine.step vs transformers' ModernBertModel.

A random ModernBERT with the base model's widths (hidden 768, 12 heads, GeGLU
1152, window 128, global every 3rd layer; ``--layers`` of them, 22 in the real
base model) is written to a temporary directory. Both sides run the same
batches of token ids, one call per batch as a server receives them:
the engine packed (no padding; per-sequence global attention, banded local
attention), transformers padded to the longest sequence with an attention
mask (SDPA), as sentence-transformers calls it.

Scenarios: ``uniform512`` (8 x 512 tokens) and ``mixed`` (32 lengths drawn
log-uniformly from 8 to 512). Time is process CPU time with one torch thread
(``time.process_time``), which other processes' load barely moves; the ratio
is what to read.

    python -m bench modernbert [--layers 6] [--repeats 2]
    python -m bench modernbert --local-ab [--threads 2] [--repeats 10]

``--local-ab`` times instead where the local layers attend in bf16 (torch's threads,
``--threads``): on the native attention kernel with the window as a bias by distance
(modules/modernbert.py's ``local_attention``, up to ``NATIVE_WINDOWS`` windows a
sequence) against the banded SDPA (``sliding_window_from_positions``, what ran before
and what runs for longer sequences). One engine as served, the other with its model's
``native_local`` off, the two taking turns; wall ms per step (median).
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np
import torch


def build(directory: Path, layers: int) -> None:
    import transformers

    config = transformers.ModernBertConfig(
        vocab_size=50368, hidden_size=768, num_hidden_layers=layers, num_attention_heads=12,
        intermediate_size=1152, max_position_embeddings=8192, local_attention=128,
        global_attn_every_n_layers=3, global_rope_theta=160_000.0, local_rope_theta=10_000.0)
    torch.manual_seed(0)
    transformers.ModernBertModel(config).eval().save_pretrained(directory)


def cpu_seconds(call) -> float:
    started = time.process_time()
    call()
    return time.process_time() - started


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=6)
    parser.add_argument("--repeats", type=int, default=None,
                        help="timed batches per scenario (default: 2; --local-ab: 10)")
    parser.add_argument("--local-ab", action="store_true",
                        help="bf16: local layers on the attention kernel against the banded SDPA (see above)")
    parser.add_argument("--threads", type=int, default=2, help="torch threads for --local-ab")
    args = parser.parse_args(argv)
    if args.local_ab:
        return local_ab(args.layers, args.repeats or 10, args.threads)
    args.repeats = args.repeats or 2
    torch.set_num_threads(1)
    import transformers

    from embedserve.engine import Batch, Engine

    rng = np.random.default_rng(0)
    scenarios = {"uniform512": [512] * 8,
                 "mixed": np.exp(rng.uniform(np.log(8), np.log(512), 32)).astype(int).tolist()}
    with tempfile.TemporaryDirectory() as tmp:
        directory = Path(tmp)
        build(directory, args.layers)
        reference = transformers.ModernBertModel.from_pretrained(directory, attn_implementation="sdpa").eval()
        print(f"ModernBERT-base widths, {args.layers} layers, 1 thread, CPU seconds per batch "
              f"(best of {args.repeats})")
        print("| scenario | tokens | engine s | transformers s | engine speed-up |")
        print("|---|---|---|---|---|")
        with Engine.load(directory) as engine:
            for name, lengths in scenarios.items():
                sequences = [rng.integers(5, 50000, n).astype(np.int32) for n in lengths]
                batch = Batch.from_sequences(sequences)
                longest = max(lengths)
                ids = torch.zeros(len(lengths), longest, dtype=torch.int64)
                mask = torch.zeros(len(lengths), longest, dtype=torch.int64)
                for i, s in enumerate(sequences):
                    ids[i, :len(s)] = torch.from_numpy(s.astype(np.int64))
                    mask[i, :len(s)] = 1

                def ours() -> None:
                    engine.step(batch).wait()

                def theirs() -> None:
                    with torch.inference_mode():
                        reference(input_ids=ids, attention_mask=mask)

                ours(), theirs()                                   # warm-up
                engine_s = min(cpu_seconds(ours) for _ in range(args.repeats))
                reference_s = min(cpu_seconds(theirs) for _ in range(args.repeats))
                print(f"| {name} | {sum(lengths)} | {engine_s:.2f} | {reference_s:.2f} | "
                      f"{reference_s / engine_s:.2f}x |", flush=True)
    return 0


def local_ab(layers: int, repeats: int, threads: int) -> int:
    """``--local-ab``: wall ms per bf16 step, local layers on the kernel against banded."""
    from bench.mixed_lengths import alternating_step_ms
    from embedserve.engine import Batch, Engine
    from embedserve.engine.modules import bf16_attention

    if not bf16_attention.kernel_available():
        print("the native bf16 attention kernel does not run here (not built, or no AVX512-BF16)")
        return 1
    torch.set_num_threads(threads)
    rng = np.random.default_rng(0)
    shapes = {"8 x 512": [512] * 8, "32 mixed, 8-512": np.exp(rng.uniform(np.log(8), np.log(512), 32)).astype(int),
              "1 x 8": [8], "4 x 1024": [1024] * 4, "1 x 2048": [2048]}
    with tempfile.TemporaryDirectory() as tmp:
        directory = Path(tmp)
        build(directory, layers)
        print(f"ModernBERT-base widths, {layers} layers, random weights, bf16, {threads} threads; wall ms per "
              f"step, median of {repeats}, the two taking turns")
        print("| step | tokens | banded SDPA | window on the kernel | kernel / banded |")
        print("|---|---:|---:|---:|---:|")
        with (Engine.load(directory, dtype="bfloat16") as kernel,
              Engine.load(directory, dtype="bfloat16") as banded):
            banded.model.native_local = False
            for name, lengths in shapes.items():
                batch = Batch.from_sequences([rng.integers(5, 50000, int(n)).astype(np.int32) for n in lengths])
                ms = alternating_step_ms({"banded": banded, "kernel": kernel}, batch, repeats)
                print(f"| {name} | {batch.num_tokens} | {ms['banded']:.2f} | {ms['kernel']:.2f} | "
                      f"{ms['kernel'] / ms['banded']:.2f}x |", flush=True)
    return 0
