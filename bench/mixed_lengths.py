"""Shared by the CPU benchmarks that put embedserve's engine beside a sentence-transformers
reference in one run: mixed-length texts cut from Python's own documentation, and the CPU
time of a call.

Time is process CPU time (``time.process_time``) with one torch thread: on a shared
machine other processes' load barely moves it, so the ratio of two sides measured in the
same run is what to read, not the absolute rates.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

import numpy as np


def mixed_texts(count: int, rng: np.random.Generator, fewest: int = 4, most: int = 300) -> list[str]:
    """``count`` windows of the pydoc topics whose word counts are log-uniform in [fewest, most]."""
    from pydoc_data.topics import topics

    words = " ".join(topics.values()).split()
    lengths = np.exp(rng.uniform(np.log(fewest), np.log(most), count)).astype(int)
    starts = rng.integers(0, len(words) - most - 100, count)
    return [" ".join(words[s:s + n]) for s, n in zip(starts, lengths, strict=True)]


def cpu_seconds(call: Callable[[], object]) -> float:
    """The process CPU seconds (all threads) one ``call()`` takes."""
    started = time.process_time()
    call()
    return time.process_time() - started


def best_cpu_seconds(call: Callable[[], object], repeats: int) -> float:
    """The fewest CPU seconds of ``repeats`` calls."""
    return min(cpu_seconds(call) for _ in range(repeats))


def speedup_table(scenario: str, tokens: int, engine_s: float, reference_s: float) -> str:
    """The markdown rows the CPU benchmarks print: tokens/s of each side and the ratio."""
    return "\n".join([
        "| scenario | tokens | embedserve tok/s | sentence-transformers tok/s | speed-up |",
        "|---|---|---|---|---|",
        f"| {scenario} | {tokens} | {tokens / engine_s:.0f} | {tokens / reference_s:.0f} | "
        f"{reference_s / engine_s:.2f}x |"])


def alternating_step_ms(engines: dict[str, Any], batch: Any, repeats: int, warmup: int = 2) -> dict[str, float]:
    """Median wall ms of an inline ``step(batch)`` per engine, the engines taking turns
    (``warmup`` rounds first): two configurations of one model compared on a host whose
    speed drifts."""
    times: dict[str, list[float]] = {name: [] for name in engines}
    for i in range(warmup + repeats):
        for name, engine in engines.items():
            started = time.perf_counter()
            engine.step(batch, inline=True).wait()
            if i >= warmup:
                times[name].append((time.perf_counter() - started) * 1e3)
    return {name: statistics.median(values) for name, values in times.items()}
