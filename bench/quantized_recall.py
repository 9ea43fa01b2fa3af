"""Retrieval quality of quantized embeddings: XQuAD recall@1 per precision, next to float32.

``python -m bench quantized_recall [--langs en,de,...] [--dimensions 384,128] [--dtype bfloat16]``

Each XQuAD language: its 240 passages (``passage: ``) and 1190 questions
(``query: ``) are embedded once by an in-process Engine (the default model,
float32 unless ``--dtype`` says otherwise (auto: as a replica resolves and
probes it), the same tokenizer and post-processing a replica uses); each
question retrieves the passage with the best score; recall@1 is the share of
questions whose own passage comes first. Quantized with the model's stored
calibration (``embedserve.calibration``, the same file replicas read, computed
here if absent), after Matryoshka truncation and renormalization:

    float32   inner product of the normalized vectors (the reference)
    float16   inner product of the float16 values
    int8      inner product of the int8 buckets (uint8 buckets minus 128)
    uint8     L2 distance between the uint8 buckets (offset-free, so ranks as int8's L2)
    binary    Hamming distance between the packed bits (ubinary's bits are the same)
    binary+rescore  Hamming top-k passages, re-ranked by float query . (+-1 bits)

Needs ../shared/data/eval/xquad (``--data-dir``); without it, one line and exit 2.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

from bench.reference_data import DEFAULT_DATA_DIR, MISSING_EXIT_STATUS, missing_line, read_xquad
from embedserve.scheduler.settings import REPLICA_DTYPES

RESCORE_TOP_K = 10


def embed_texts(engine, tokenizer, texts: list[str], prompt: str, max_tokens: int = 4096) -> np.ndarray:
    """Raw pooled float32 [N, dim], batched by tokens (inputs cut at the model's limit)."""
    from embedserve.engine.batch import Batch

    encoded = tokenizer.encode_batch([prompt + t for t in texts],
                                     max_length=engine.info.max_positions, truncation="right")
    rows, start, lengths = [], 0, encoded.lengths
    while start < len(texts):
        stop, tokens = start, 0
        while stop < len(texts) and (stop == start or tokens + lengths[stop] <= max_tokens):
            tokens += int(lengths[stop])
            stop += 1
        rows.append(engine.step(Batch.of(encoded.slice(start, stop))).wait())
        start = stop
    return np.concatenate(rows, axis=0)


def _hamming(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """[Q, w] x [P, w] packed uint8 -> [Q, P] differing bits."""
    return np.bitwise_count(a[:, None, :] ^ b[None, :, :]).sum(-1, dtype=np.int32)


def recalls(queries: np.ndarray, passages: np.ndarray, relevant: np.ndarray,
            ranges: np.ndarray) -> dict[str, float]:
    """recall@1 (%) per precision for post-processed float32 queries [Q, d] and passages [P, d]."""
    from embedserve.model.quantize import quantize

    def hit(scores: np.ndarray) -> float:
        return float((scores.argmax(1) == relevant).mean() * 100)

    q8, p8 = (quantize(x, "int8", ranges).astype(np.int32) for x in (queries, passages))
    qu, pu = (quantize(x, "uint8", ranges).astype(np.int32) for x in (queries, passages))
    qb, pb = (quantize(x, "ubinary") for x in (queries, passages))
    hamming = _hamming(qb, pb)
    # Rescore: the binary top-k, re-ranked by the float query against the passages' bits.
    signs = np.unpackbits(pb, axis=-1, count=queries.shape[1]).astype(np.float32) * 2 - 1
    top = np.argsort(hamming, axis=1, kind="stable")[:, :RESCORE_TOP_K]
    rescored = np.einsum("qd,qkd->qk", queries, signs[top])
    rescore_hits = top[np.arange(len(top)), rescored.argmax(1)] == relevant
    half = (queries.astype(np.float16).astype(np.float32) @ passages.astype(np.float16).astype(np.float32).T)
    return {
        "float32": hit(queries @ passages.T),
        "float16": hit(half),
        "int8": hit(q8 @ p8.T),
        # -|q - p|^2 up to the per-query constant |q|^2
        "uint8": hit(2 * (qu @ pu.T) - (pu * pu).sum(1)[None, :]),
        "binary": hit(-hamming),
        f"binary+rescore@{RESCORE_TOP_K}": float(rescore_hits.mean() * 100),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench quantized_recall",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", type=Path, default=DEFAULT_DATA_DIR)
    parser.add_argument("--langs", default="en,de,ru,zh,ar,hi")
    parser.add_argument("--dimensions", default="384,128",
                        help="Matryoshka widths to measure (comma-separated)")
    parser.add_argument("--model", type=Path, default=None, help="default: multilingual-e5-small")
    parser.add_argument("--cache-dir", type=Path, default=None,
                        help="where the calibration is read or stored (as replicas use)")
    parser.add_argument("--dtype", default="float32", choices=REPLICA_DTYPES,
                        help="the engine's compute dtype: run once per dtype and compare their "
                             "float32 rows (default: %(default)s)")
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    args = parser.parse_args(argv)
    langs = args.langs.split(",")
    paths = [args.data_dir / "eval" / "xquad" / f"xquad.{lang}.json" for lang in langs]
    line = missing_line("bench quantized_recall", paths, "--data-dir")
    if line:
        print(line, file=sys.stderr)
        return MISSING_EXIT_STATUS

    from embedserve import calibration
    from embedserve.defaults.build import ensure_default_model
    from embedserve.defaults.model_args import default_cache_dir
    from embedserve.engine.batch import Batch
    from embedserve.model.postprocess import postprocess_embeddings
    from embedserve.scheduler.engine_loading import load_engine
    from embedserve.tokenizer import Tokenizer

    cache_dir = args.cache_dir or default_cache_dir()
    model_dir = args.model or ensure_default_model(cache_dir)
    engine = load_engine(model_dir, "cpu", args.dtype)
    tokenizer = Tokenizer.from_model_dir(model_dir)
    info = engine.info
    started = time.perf_counter()
    cal = calibration.load_or_calibrate(
        calibration.calibration_dir(cache_dir, model_dir, info.dtype), model_dir, info,
        lambda tokens: engine.step(Batch.of(tokens)).wait())
    query_prompt, passage_prompt = info.prompts.get("query", ""), info.prompts.get("passage", "")
    results: dict[str, dict[str, dict[str, float]]] = {}
    for lang, path in zip(langs, paths):
        passages, questions, relevant = read_xquad(path)
        raw_p = embed_texts(engine, tokenizer, passages, passage_prompt)
        raw_q = embed_texts(engine, tokenizer, questions, query_prompt)
        for dims in (int(d) for d in args.dimensions.split(",")):
            d = None if dims == info.dimension else dims
            q = postprocess_embeddings(raw_q, info.normalize, d)
            p = postprocess_embeddings(raw_p, info.normalize, d)
            results.setdefault(str(dims), {})[lang] = recalls(q, p, relevant,
                                                               cal.ranges(d, info.normalize))
        print(f"# {lang}: {len(questions)} questions, {len(passages)} passages "
              f"({time.perf_counter() - started:.0f} s)", file=sys.stderr, flush=True)
    engine.close()
    meta = {"model": model_dir.name, "dtype": info.dtype, "dtype_reason": info.dtype_reason,
            "calibration_id": cal.calibration_id,
            "calibration_sample_size": cal.sample_size, "load_average": os.getloadavg()[0]}
    if args.json:
        print(json.dumps({"meta": meta, "recall_at_1": results}, indent=2))
        return 0
    print(f"XQuAD recall@1 (%), {meta['model']} {meta['dtype']}, calibration "
          f"{meta['calibration_id']} ({meta['calibration_sample_size']} vectors)")
    for dims, by_lang in results.items():
        precisions = list(next(iter(by_lang.values())))
        print(f"\ndimensions {dims}\n")
        print("| precision | " + " | ".join(langs) + " | mean | vs float32 |")
        print("|---|" + "---|" * (len(langs) + 2))
        reference = np.mean([by_lang[lang]["float32"] for lang in langs])
        for precision in precisions:
            values = [by_lang[lang][precision] for lang in langs]
            mean = float(np.mean(values))
            print(f"| {precision} | " + " | ".join(f"{v:.1f}" for v in values)
                  + f" | {mean:.1f} | {mean - reference:+.1f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
