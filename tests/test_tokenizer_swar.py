"""kernels/swar.py's word-at-a-time byte tests against the same test made byte by byte."""

from __future__ import annotations

import numpy as np
from numba import njit

from embedserve.tokenizer.kernels.swar import high_bits, leading_run, load_u64, outside_printable, store_u64


@njit
def _runs(buf, lowest):
    runs = np.empty(buf.shape[0] - 7, np.int64)
    for i in range(buf.shape[0] - 7):
        runs[i] = leading_run(outside_printable(load_u64(buf, i), lowest))
    return runs


@njit
def _high_runs(buf):
    runs = np.empty(buf.shape[0] - 7, np.int64)
    for i in range(buf.shape[0] - 7):
        runs[i] = leading_run(high_bits(load_u64(buf, i)))
    return runs


@njit
def _copy_words(src, dst):
    for i in range(0, src.shape[0] - 7, 8):
        store_u64(dst, i + 1, load_u64(src, i))   # unaligned on purpose


def _expected_runs(buf: np.ndarray, inside) -> list[int]:
    runs = []
    for i in range(len(buf) - 7):
        word = buf[i:i + 8]
        runs.append(next((k for k, b in enumerate(word) if not inside(b)), 8))
    return runs


def test_the_run_before_the_first_byte_outside_is_exact_for_every_byte_value() -> None:
    rng = np.random.default_rng(7)
    # Every byte value next to every other, and random words biased to printable ASCII
    # with an outlier here and there (where borrows and carries could mislead).
    every = np.arange(256, dtype=np.uint8)
    mixed = np.where(rng.random(20_000) < 0.9, rng.integers(0x20, 0x7F, 20_000), rng.integers(0, 256, 20_000))
    buf = np.concatenate([every, every[::-1], np.repeat(every, 3), mixed.astype(np.uint8)])
    for lowest in (0x01, 0x20, 0x21, 0x7E):
        assert _runs(buf, lowest).tolist() == _expected_runs(buf, lambda b, lo=lowest: lo <= b <= 0x7E)
    assert _high_runs(buf).tolist() == _expected_runs(buf, lambda b: b < 0x80)


def test_a_word_is_stored_byte_for_byte_at_any_offset() -> None:
    src = np.arange(64, dtype=np.uint8) * 3
    dst = np.zeros(72, np.uint8)
    _copy_words(src, dst)
    assert dst[0] == 0 and (dst[1:65] == src).all() and (dst[65:] == 0).all()
