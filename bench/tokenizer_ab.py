"""Tokenizer A/B in one process: this tree's Unigram encoder against an earlier commit's.

The multilingual table of tokenizer_bench (UDHR, 512 tokens a text) compares ours with
sentencepiece in separate processes for before and after; on a shared 2-core machine the
load moves each run's ratio by several percent, more than a change of a few percent.
Here both versions are loaded into one process (the earlier commit's ``embedserve``
package is extracted with ``git archive`` and renamed ``embedserve_before``) and timed
per text, each call followed by a sentencepiece call as in the bench.

The order alternates per text: whichever version runs second on a text runs ~5-10 %
faster (its branch predictor and caches were just trained on that text by the same
kind of work), so the paired ratio is reported for each order and their geometric mean
("unbiased") is the estimate. Each mode also gets "stream" rows, text the caches have
not seen: every UDHR line once, and the issue's measure, every 512-token UDHR text once
("stream 512"), both word caches cleared first (and again with the caches off), the same
pairing. The "/ sp" columns are each version's median per-text ratio to the sentencepiece
call after it; on a stream the version that runs first on a text also warms the machine
for the second, so the figure against the issue's target is ``python -m bench tokenizer
--only stream`` (one version, sentencepiece, alternating), and here the after/before
ratios are the measure.

    python -m bench tokenizer_ab --rev fb70ee1 [--data ../shared/data] [--passes 4]
"""

from __future__ import annotations

import argparse
import io
import math
import os
import re
import statistics
import subprocess
import sys
import tarfile
import time
from pathlib import Path

from bench.reference_data import DEFAULT_DATA_DIR, MISSING_EXIT_STATUS, missing_line

BEFORE_PACKAGE = "embedserve_before"
_IMPORTS = re.compile(r"\bembedserve(?=[.\s])")
# Where the extracted trees live, one per commit, so their compiled kernels are reused.
TREES_DIR = Path("~/.cache/embedserve/tokenizer_ab").expanduser()


def extract_before(rev: str) -> Path:
    """The ``embedserve`` package of ``rev`` as ``embedserve_before`` under a directory
    to put on sys.path (reused when already there)."""
    commit = subprocess.run(["git", "rev-parse", "--verify", f"{rev}^{{commit}}"], check=True,
                            capture_output=True, text=True).stdout.strip()
    root = TREES_DIR / commit
    package = root / BEFORE_PACKAGE
    if package.is_dir():
        return root
    archive = subprocess.run(["git", "archive", "--format=tar", commit, "embedserve"], check=True,
                             capture_output=True).stdout
    staging = root.with_suffix(".tmp")
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(staging, filter="data")
    for path in (staging / "embedserve").rglob("*.py"):
        path.write_text(_IMPORTS.sub(BEFORE_PACKAGE, path.read_text(encoding="utf-8")), encoding="utf-8")
    (staging / "embedserve").rename(staging / BEFORE_PACKAGE)
    staging.rename(root)
    return root


def paired_ratios(before, after, reference, texts: list[str], passes: int) -> dict:
    """p50s and the after/before ratio per order of the two versions (see the docstring)."""
    samples: dict[str, list[int]] = {"before": [], "after": [], "ref_before": [], "ref_after": []}
    by_order: dict[str, list[int]] = {"before first": [], "after first": []}
    for p in range(passes):
        for i, text in enumerate(texts):
            calls = [("before", before), ("ref_before", reference), ("after", after), ("ref_after", reference)]
            first = "before first"
            if (p + i) % 2:
                calls, first = calls[2:] + calls[:2], "after first"
            by_order[first].append(len(samples["after"]))
            for name, call in calls:
                t0 = time.perf_counter_ns()
                call(text)
                samples[name].append(time.perf_counter_ns() - t0)
    p50 = {name: statistics.median(v) / 1000 for name, v in samples.items()}
    ratio = {order: statistics.median(samples["after"][k] / samples["before"][k] for k in rows)
             for order, rows in by_order.items()}
    to_sp = {name: statistics.median(a / r for a, r in zip(samples[name], samples[f"ref_{name}"], strict=True))
             for name in ("before", "after")}
    return {"p50": p50, "ratio": ratio, "unbiased": math.sqrt(ratio["before first"] * ratio["after first"]),
            "to_sp": to_sp}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rev", required=True, help="the earlier commit (before)")
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA_DIR)
    parser.add_argument("--passes", type=int, default=4, help="times each text is encoded by each version")
    args = parser.parse_args(argv)
    needed = [args.data / "xlmr" / "sentencepiece.bpe.model", args.data / "xlmr" / "tokenizer.json",
              args.data / "text" / "udhr2"]
    if (problem := missing_line("python -m bench tokenizer_ab", needed, "--data")) is not None:
        print(problem, file=sys.stderr)
        return MISSING_EXIT_STATUS
    sys.path.insert(0, str(extract_before(args.rev)))
    import importlib

    import sentencepiece

    from bench.tokenizer_bench import udhr_documents, udhr_windows
    from embedserve.tokenizer import Tokenizer as After
    Before = importlib.import_module(f"{BEFORE_PACKAGE}.tokenizer").Tokenizer

    sp = sentencepiece.SentencePieceProcessor(model_file=str(args.data / "xlmr" / "sentencepiece.bpe.model"))
    documents = udhr_documents(args.data)
    texts = udhr_windows(sp, documents)
    lines = [line for document in documents for line in document.split("\n") if line.strip()]
    reference = lambda t: sp.encode(t, add_bos=True, add_eos=True)  # noqa: E731
    print(f"before {args.rev}, after this tree; {len(texts)} UDHR texts of 512 tokens, {args.passes} passes; "
          f"stream: each of {len(lines)} UDHR lines once, word caches cleared first\n")
    print("| mode | load | before p50 / sp | after p50 / sp | before / sp | after / sp | after/before, before first "
          "| after first | unbiased |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    from embedserve.tokenizer.spec import Compat

    modes: tuple[tuple[Compat, str], ...] = (("sentencepiece", "sentencepiece.bpe.model"), ("hf", "tokenizer.json"))
    unbiased: dict[str, list[float]] = {}
    for compat, name in modes:
        for first in ("before", "after"):
            for label, r in version_rows(Before, After, args.data / "xlmr" / name, compat, first, texts, lines,
                                         reference, args.passes):
                unbiased.setdefault(label, []).append(r["unbiased"])
    print("\nafter/before (unbiased) with each version's tokenizer built first, and their geometric mean:\n")
    print("| rows | before built first | after built first | mean |")
    print("|---|---:|---:|---:|")
    for label, (before_first, after_first) in unbiased.items():
        print(f"| {label} | {before_first:.3f} | {after_first:.3f} | {math.sqrt(before_first * after_first):.3f} |")
    return 0


def version_rows(Before, After, path: Path, compat, first: str, texts: list[str], lines: list[str],  # noqa: N803
                 reference, passes: int):
    """One mode's rows, the two versions' tokenizers built ``first`` ("before" or "after")
    first: on this project's VM hosts the tokenizer built first of two identical ones
    read 3-10 % slower (docs/tokenizer.md), so ``main`` runs each order and reports both.
    Yields (rows' label, paired_ratios result) after printing each row."""
    def build(**options):
        if first == "before":
            before = Before.from_file(path, compat=compat, **options)
            return before, After.from_file(path, compat=compat, **options)
        after = After.from_file(path, compat=compat, **options)
        return Before.from_file(path, compat=compat, **options), after

    before, after = build()
    for text in texts:  # warm, and the same ids
        if before.encode(text).tolist() != after.encode(text).tolist():
            raise SystemExit(f"{compat}: before and after differ on {text[:40]!r}")
    tag = f"{first} built first"
    load = os.getloadavg()[0]
    r = paired_ratios(before.encode, after.encode, reference, texts, passes)
    row(f"{compat} ({tag})", load, r)
    yield compat, r
    # Text the caches have not seen: what a word cache costs where it cannot pay.
    for label, stream in ((f"{compat}, stream", lines), (f"{compat}, stream 512", texts)):
        before.clear_word_cache()
        after.clear_word_cache()
        load = os.getloadavg()[0]
        r = paired_ratios(before.encode, after.encode, reference, stream, 1)
        row(f"{label} ({tag})", load, r)
        yield label, r
    before_off, after_off = build(word_cache_slots=0)
    before_off.encode(texts[0])
    after_off.encode(texts[0])
    load = os.getloadavg()[0]
    r = paired_ratios(before_off.encode, after_off.encode, reference, texts, 1)
    row(f"{compat}, stream 512, cache off ({tag})", load, r)
    yield f"{compat}, stream 512, cache off", r


def row(name: str, load: float, r: dict) -> None:
    p50 = r["p50"]
    print(f"| {name} | {load:.1f}-{os.getloadavg()[0]:.1f} | {p50['before']:.1f} / {p50['ref_before']:.1f} | "
          f"{p50['after']:.1f} / {p50['ref_after']:.1f} | {r['to_sp']['before']:.3f} | {r['to_sp']['after']:.3f} | "
          f"{r['ratio']['before first']:.3f} | "
          f"{r['ratio']['after first']:.3f} | {r['unbiased']:.3f} |", flush=True)


if __name__ == "__main__":
    raise SystemExit(main())
