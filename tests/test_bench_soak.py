"""bench/soak.py's arithmetic and process discovery (the soak itself is a benchmark, not a test)."""

from __future__ import annotations

import os
import random
import subprocess
import sys

import pytest

from bench.soak import FALLBACK_WORDS, children, memory_mb, random_batch, slope_mb_per_min, summarize


def test_slope_is_mb_per_minute() -> None:
    assert slope_mb_per_min([(0.0, 100.0), (60.0, 110.0), (120.0, 120.0)]) == pytest.approx(10.0)
    assert slope_mb_per_min([(0.0, 5.0), (30.0, 5.0)]) == 0.0
    assert slope_mb_per_min([(0.0, 5.0)]) == 0.0


def test_summary_reads_warm_up_final_max_and_last_half() -> None:
    # Grows 1 MB/s for the first 60 s (warm-up), then flat at 160 except one 170 peak.
    rows = [{"t_s": float(t), "role": "replica 0", "rss_mb": 100.0 + min(t, 60), "anon_mb": 50.0 + t / 60}
            for t in range(0, 301, 10)]
    rows[20]["rss_mb"] = 170.0                                      # t = 200 s
    (line,) = summarize(rows, warmup_s=60, duration_s=300)
    assert line["warmup_mb"] == 160.0 and line["final_mb"] == 160.0 and line["max_mb"] == 170.0
    assert line["ratio"] == 1.0
    assert line["anon_slope_mb_min"] == pytest.approx(1.0)          # anon grows 1 MB per minute
    assert abs(line["slope_mb_min"]) < 3.0                          # one peak, no trend


def test_batches_have_1_to_32_texts_of_3_to_400_words() -> None:
    rng = random.Random(0)
    for _ in range(50):
        texts = random_batch(rng, [FALLBACK_WORDS])
        assert 1 <= len(texts) <= 32
        assert all(3 <= len(text.split()) <= 400 for text in texts)


def test_children_and_memory_come_from_proc() -> None:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        assert child.pid in children(os.getpid())
        rss, anon = memory_mb(child.pid)
        assert 0 < anon <= rss
    finally:
        child.kill()
        child.wait()
