"""``--dtype int8`` against bfloat16 on the CPU: step throughput and closeness to float32.

``python -m bench int8 [--model DIR] [--batch 32] [--tokens 512] [--rounds 5] [--texts 200] [--without-amx]
[--attention-ab]``

Loads the model three times in process as a replica would (``load_engine``:
float32, bfloat16, int8 with its calibration), then

- throughput: steps of ``--batch`` sequences of ``--tokens`` random ids, bf16 and
  int8 taking turns in rotating order, ``--rounds`` each after one warm-up; the median per dtype and
  int8's speed-up over bf16 (the ratio is what to compare: both run in the same
  process, interleaved, on a shared machine); ``--attention-ab`` adds int8 with its
  attention's products in bf16 (``Int8Layer.int8_attention`` off) as a third, taking turns;
- accuracy on real text: XQuAD English (``../shared/data/eval/xquad``; skipped with a
  line when absent), its 240 passages (``passage: ``) and 1190 questions (``query: ``)
  embedded in float32 and int8 (``--texts N``: the first N of each, 0: none): the
  smallest and mean cosine of each vector to float32's, and, on the whole set,
  recall@1 of each question's own passage (as ``python -m bench quantized_recall``
  computes it, float vectors) in both.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np

from bench.reference_data import DEFAULT_DATA_DIR, read_xquad
from bench.without_amx import add_option, apply

BF16_ATTENTION = "int8, bf16 attention"


def _cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.sum(a * b, axis=1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench int8", description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, default=None, help="default: multilingual-e5-small")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--tokens", type=int, default=512)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--texts", type=int, default=None,
                        help="XQuAD passages and questions each (default: all; 0: no accuracy)")
    parser.add_argument("--data-dir", type=Path, default=DEFAULT_DATA_DIR)
    parser.add_argument("--threads", type=int, default=None,
                        help="torch's thread count (default: torch's). With 1 on a busy machine the "
                             "process CPU time of each step is a steadier figure than the wall time")
    parser.add_argument("--attention-ab", action="store_true",
                        help="also time int8 with attention's products in bf16 (their int8 products off)")
    add_option(parser)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)

    apply(args)
    import torch

    from bench.quantized_recall import embed_texts
    from embedserve import ragged
    from embedserve.defaults.build import ensure_default_model
    from embedserve.defaults.model_args import default_cache_dir
    from embedserve.engine.batch import Batch
    from embedserve.scheduler.engine_loading import load_engine
    from embedserve.tokenizer import Tokenizer

    if args.threads:
        torch.set_num_threads(args.threads)
    model_dir = args.model or ensure_default_model(default_cache_dir())
    engines = {dtype: load_engine(model_dir, "cpu", dtype) for dtype in ("float32", "bfloat16", "int8")}
    info = engines["int8"].info
    tokens = min(args.tokens, info.max_positions)
    ids = np.random.default_rng(0).integers(1000, 20000, size=(args.batch, tokens))
    batch = Batch.of(ragged.from_sequences(list(ids)))
    contenders = ["bfloat16", "int8"] + ([BF16_ATTENTION] if args.attention_ab else [])
    times: dict[str, list[float]] = {name: [] for name in contenders}
    cpu_times: dict[str, list[float]] = {name: [] for name in contenders}
    int8_layers = [layer for layer in engines["int8"].model.encoder.layers if hasattr(layer, "int8_attention")]

    def step(name: str) -> None:
        for layer in int8_layers:
            layer.int8_attention = name != BF16_ATTENTION
        engines["bfloat16" if name == "bfloat16" else "int8"].step(batch).wait()

    loads = [os.getloadavg()[0]]
    for name in times:
        step(name)
    for round_ in range(args.rounds):
        # each contender after each other in turn: one that follows the same engine's step
        # finds its weights in the caches (at few tokens that is most of a step)
        shift = round_ % len(contenders)
        for name in contenders[shift:] + contenders[:shift]:
            started, cpu_started = time.perf_counter(), time.process_time()
            step(name)
            times[name].append(time.perf_counter() - started)
            cpu_times[name].append(time.process_time() - cpu_started)
        loads.append(os.getloadavg()[0])
    median = {dtype: statistics.median(values) for dtype, values in times.items()}
    cpu_median = {dtype: statistics.median(values) for dtype, values in cpu_times.items()}
    result: dict[str, object] = {
        "model": model_dir.name, "int8_reason": info.dtype_reason, "shape": f"{args.batch} x {tokens}",
        "amx": "hidden (--without-amx)" if args.without_amx else "as the CPU has it",
        "threads": torch.get_num_threads(), "load_average": [round(value, 2) for value in loads],
        "step_ms": {dtype: round(value * 1e3, 1) for dtype, value in median.items()},
        "int8_speedup_vs_bf16": round(median["bfloat16"] / median["int8"], 3),
        "step_cpu_ms": {dtype: round(value * 1e3, 1) for dtype, value in cpu_median.items()},
        "int8_cpu_time_speedup_vs_bf16": round(cpu_median["bfloat16"] / cpu_median["int8"], 3),
    }
    if args.attention_ab:
        result["int8_with_bf16_attention_speedup_vs_bf16"] = round(median["bfloat16"] / median[BF16_ATTENTION], 3)
    for layer in int8_layers:
        layer.int8_attention = True
    xquad = args.data_dir / "eval" / "xquad" / "xquad.en.json"
    engines.pop("bfloat16").close()
    if args.texts != 0 and xquad.is_file():
        passages, questions, relevant = read_xquad(xquad)
        if args.texts is not None:
            keep = relevant < args.texts
            passages, questions, relevant = passages[:args.texts], list(np.array(questions)[keep]), relevant[keep]
        tokenizer = Tokenizer.from_model_dir(model_dir)
        prompts = info.prompts
        for dtype, engine in engines.items():
            p = embed_texts(engine, tokenizer, passages, prompts.get("passage", ""))
            q = embed_texts(engine, tokenizer, questions, prompts.get("query", ""))
            vectors = np.concatenate([p, q])
            if dtype == "float32":
                reference = vectors
            else:
                cosines = _cosines(reference, vectors)
                result["int8_cosine_to_float32"] = {"min": round(float(cosines.min()), 5),
                                                    "mean": round(float(cosines.mean()), 5),
                                                    "vectors": len(cosines)}
            p = p / np.linalg.norm(p, axis=1, keepdims=True)
            q = q / np.linalg.norm(q, axis=1, keepdims=True)
            result[f"{dtype}_xquad_en_recall_at_1"] = round(float(((q @ p.T).argmax(1) == relevant).mean() * 100), 2)
    else:
        print(f"# accuracy skipped (--texts 0, or no {xquad}: pass --data-dir)", file=sys.stderr)
    for engine in engines.values():
        engine.close()
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        for key, value in result.items():
            print(f"{key}: {value}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
