"""CPU benchmark: tokens/s of Engine.step vs sentence-transformers encode.

Both run the default model (multilingual-e5-small) in this process with the
same torch thread count, on the same batches of 32 texts, one call per batch
as a server receives them:

- ``uniform128`` / ``uniform512``: every text is exactly 128 / 512 tokens;
- ``mixed``: lengths drawn log-uniformly from 8 to 512 (many short texts, a
  long tail, as embedding traffic looks), so padding to the longest text costs
  sentence-transformers a lot and the packed engine nothing.

Texts are windows of botchan.txt (../shared/data) decoded from token ids, so
both sides tokenize the same text to the same ids. Engine.step receives
token ids (tokenizing is the gateway's job); sentence-transformers' encode
tokenizes inside its call (measured separately: about 1% of its time).

    .venv/bin/python bench/engine_bench.py [--threads 2] [--repeats 2] [--attention] [--bf16]

``--fused-ab`` only compares the oneDNN fused layers (engine/onednn.py) with
the plain modules in single-thread CPU time (``time.thread_time``), which other
processes' load barely moves, on random ids (1x128, 1x512, 4x512; fp32, bf16).

``--attention`` also times the other attention layouts (how the CPU default
was chosen; block-diagonal only where a batch has at most 4,096 tokens, as
its T x T scores need 12 GB at 16k tokens); ``--bf16`` adds a bfloat16 row;
``--jagged`` times attention alone, per-sequence loop vs nested (jagged) SDPA.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

from bench.reference_data import DEFAULT_DATA_DIR, MISSING_EXIT_STATUS, missing_line

CORPUS = DEFAULT_DATA_DIR / "text" / "botchan.txt"
BATCH = 32


def make_texts(tokenizer, lengths: list[int], rng: np.random.Generator, corpus: list[int]) -> list[str]:
    """Texts that tokenize to exactly ``n`` ids (specials included), from corpus windows."""
    texts = []
    for n in lengths:
        for _ in range(50):
            start = int(rng.integers(0, len(corpus) - n))
            text = tokenizer.decode(corpus[start:start + n - 2])
            if len(tokenizer.encode(text).ids) == n:
                texts.append(text)
                break
        else:
            raise RuntimeError(f"no text of exactly {n} tokens found")
    return texts


def scenarios(tokenizer, repeats: int, seed: int = 0) -> dict[str, list[list[str]]]:
    rng = np.random.default_rng(seed)
    corpus_text = CORPUS.read_text(encoding="utf-8")
    corpus = tokenizer.encode(corpus_text, add_special_tokens=False).ids
    lengths = {
        "uniform128": lambda: [128] * BATCH,
        "uniform512": lambda: [512] * BATCH,
        "mixed": lambda: np.exp(rng.uniform(np.log(8), np.log(512), BATCH)).astype(int).tolist(),
    }
    return {name: [make_texts(tokenizer, make(), rng, corpus) for _ in range(repeats + 1)]
            for name, make in lengths.items()}


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def seconds_of(call) -> float:
    started = time.perf_counter()
    call()
    return time.perf_counter() - started


def jagged_vs_loop(seed: int = 0, repeats: int = 3) -> None:
    """Attention alone on one mixed batch (e5-small shapes): per-sequence loop vs jagged SDPA."""
    import torch
    import torch.nn.functional as F

    rng = np.random.default_rng(seed)
    lengths = np.exp(rng.uniform(np.log(8), np.log(512), BATCH)).astype(int)
    cu = np.r_[0, np.cumsum(lengths)]
    q, k, v = (torch.randn(int(cu[-1]), 12, 32) for _ in range(3))

    def loop() -> torch.Tensor:
        out = torch.empty_like(q)
        for start, end in zip(cu[:-1], cu[1:]):
            parts = (t[start:end].transpose(0, 1)[None] for t in (q, k, v))
            out[start:end] = F.scaled_dot_product_attention(*parts)[0].transpose(0, 1)
        return out

    offsets = torch.from_numpy(cu)

    def jagged() -> torch.Tensor:
        parts = (torch.nested.nested_tensor_from_jagged(t, offsets).transpose(1, 2) for t in (q, k, v))
        return F.scaled_dot_product_attention(*parts).transpose(1, 2).values()

    with torch.no_grad():      # jagged SDPA raises under inference_mode in torch 2.13
        diff = float((loop() - jagged()).abs().max())
        times = {f.__name__: min(seconds_of(f) for _ in range(repeats)) for f in (loop, jagged)}
    print(f"attention only, {BATCH} sequences, {int(cu[-1])} tokens: loop {times['loop'] * 1e3:.0f} ms, "
          f"jagged {times['jagged'] * 1e3:.0f} ms, max abs diff {diff:.1e}")


def fused_vs_plain(repeats: int = 5, seed: int = 0) -> None:
    """Single-thread CPU time per step: FusedLayer vs plain Layer, same weights."""
    import torch

    from embedserve.defaults.build import ensure_default_model
    from embedserve.defaults.model_args import default_cache_dir
    from embedserve.engine import Batch, Engine
    from embedserve.engine.runners.cpu import CpuRunner

    torch.set_num_threads(1)
    model_dir = ensure_default_model(default_cache_dir())
    rng = np.random.default_rng(seed)
    print("| dtype | batch | plain ms | fused ms | fused / plain |")
    print("|---|---|---|---|---|")
    for dtype in ("float32", "bfloat16"):
        fused = Engine.load(model_dir, dtype=dtype)
        plain = Engine.load(model_dir, dtype=dtype, fused_layers=False)
        runners = {name: CpuRunner(e.model, e.info, "per_sequence")
                   for name, e in (("plain", plain), ("fused", fused))}
        for count, length in ((1, 128), (1, 512), (4, 512)):
            batch = Batch.from_sequences([rng.integers(5, 200_000, length).astype(np.int32)
                                          for _ in range(count)])
            best = {name: float("inf") for name in runners}
            for _ in range(repeats + 1):            # alternate, so drifts hit both alike
                for name, runner in runners.items():
                    started = time.thread_time()
                    runner._run(batch)
                    best[name] = min(best[name], time.thread_time() - started)
            print(f"| {dtype} | {count}x{length} | {best['plain'] * 1e3:.1f} | {best['fused'] * 1e3:.1f} "
                  f"| {best['fused'] / best['plain']:.2f} |", flush=True)
        fused.close()
        plain.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=2, help="timed batches per scenario")
    parser.add_argument("--attention", action="store_true", help="also time every attention layout")
    parser.add_argument("--bf16", action="store_true", help="also time a bfloat16 engine")
    parser.add_argument("--fused-ab", action="store_true",
                        help="only compare fused and plain encoder layers in single-thread CPU time")
    parser.add_argument("--jagged", action="store_true",
                        help="only time attention: per-sequence loop vs nested (jagged) SDPA")
    args = parser.parse_args(argv)
    if args.fused_ab:
        fused_vs_plain(args.repeats + 3)
        return 0
    if args.jagged:
        import torch

        torch.set_num_threads(args.threads)
        jagged_vs_loop()
        return 0

    if (problem := missing_line("python -m bench engine", [CORPUS])) is not None:
        print(problem, file=sys.stderr)
        return MISSING_EXIT_STATUS
    os.environ["HF_HUB_OFFLINE"] = "1"
    import torch
    from sentence_transformers import SentenceTransformer
    from tokenizers import Tokenizer

    from embedserve.defaults.build import ensure_default_model
    from embedserve.defaults.model_args import default_cache_dir
    from embedserve.engine import Batch, Engine
    from embedserve.engine.runners.cpu import CpuRunner

    torch.set_num_threads(args.threads)
    log("building / loading the default model and the batches")
    model_dir = ensure_default_model(default_cache_dir())
    tokenizer = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    work = scenarios(tokenizer, args.repeats)
    ids = {name: [[np.array(e.ids, np.int32) for e in tokenizer.encode_batch(texts)] for texts in batches]
           for name, batches in work.items()}
    tokens = {name: sum(sum(len(s) for s in batch) for batch in batches[1:]) for name, batches in ids.items()}

    reference = SentenceTransformer(str(model_dir), device="cpu")
    engine = Engine.load(model_dir)
    runs = {"sentence-transformers encode": lambda i, name: reference.encode(work[name][i], batch_size=BATCH)}
    layouts = ["per_sequence"] + (["padded", "block_diagonal"] if args.attention else [])
    for layout in layouts:
        # one model, several runners: only the attention layout differs
        runner = CpuRunner(engine.model, engine.info, layout)
        runs[f"engine fp32 ({layout})"] = (
            lambda i, name, runner=runner: runner.submit(Batch.from_sequences(ids[name][i])).wait())
    if args.bf16:
        bf16 = Engine.load(model_dir, dtype="bfloat16")
        runs["engine bf16 (per_sequence)"] = (
            lambda i, name: bf16.step(Batch.from_sequences(ids[name][i])).wait())

    # Calls alternate batch by batch, so load from other processes on a shared
    # machine hits every contender alike; batch 0 of each scenario is a warm-up.
    totals = {label: {name: 0.0 for name in work} for label in runs}
    for name in work:
        for i in range(args.repeats + 1):
            for label, run in runs.items():
                if "block_diagonal" in label and sum(len(s) for s in ids[name][i]) > 4096:
                    totals[label][name] = float("nan")   # T^2 scores: 12 GB at 16k tokens
                    continue
                elapsed = seconds_of(lambda: run(i, name))
                if i:
                    totals[label][name] += elapsed
            log(f"{name} batch {i} done")
    rows = {label: {name: tokens[name] / totals[label][name] for name in work} for label in runs}

    def cell(value: float, base: float | None) -> str:
        if value != value:
            return "n/a (> 4096 tokens)"
        return f"{value:,.0f}" + ("" if base is None else f" ({value / base:.2f}x)")

    names = list(work)
    base = rows["sentence-transformers encode"]
    print(f"threads={args.threads} batch={BATCH} timed batches per scenario={args.repeats}")
    print("| tokens/s | " + " | ".join(names) + " |")
    print("|---|" + "---|" * len(names))
    for label, row in rows.items():
        cells = [cell(row[n], None if row is base else base[n]) for n in names]
        print(f"| {label} | " + " | ".join(cells) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
