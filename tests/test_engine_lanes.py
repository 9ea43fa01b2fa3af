"""CPU steps side by side (engine/runners/thread_share.py, runners/cpu.py's lanes).

A real tiny BERT (two layers). Hooks of the test's own hold steps at their layers, so
what is checked is which steps compute at once and on how many threads, never timing;
every step's rows are compared bit for bit with the same step computed alone.
"""

from __future__ import annotations

import concurrent.futures
import os
import threading

import numpy as np
import pytest
import torch

from embedserve.engine.batch import Batch
from embedserve.engine.runners.cpu import default_lanes
from embedserve.engine.runners.thread_share import ThreadShare

GATE_TIMEOUT_S = 30.0
LONG_TOKENS = 300


LANE_NICE = 3


@pytest.fixture(scope="module")
def lanes_engine(tiny_bert_dir):
    """Two lanes, their threads ``LANE_NICE`` nicer than the process (as a replica's)."""
    from embedserve.engine import Engine

    with Engine.load(tiny_bert_dir, cpu_lanes=2, cpu_lane_nice=LANE_NICE) as engine:
        yield engine


@pytest.fixture(scope="module")
def one_lane_engine(tiny_bert_dir):
    from embedserve.engine import Engine

    with Engine.load(tiny_bert_dir, cpu_lanes=1) as engine:
        yield engine


def long_batch(seed: int) -> Batch:
    rng = np.random.default_rng(seed)
    return Batch.from_sequences([rng.integers(5, 1000, LONG_TOKENS // 10).tolist() for _ in range(10)])


def hook(engine, index: int, function, prepend: bool = True):
    """``function()`` before layer ``index`` of long steps; returns the handle."""
    def pre_hook(_module, args):
        if args[0].shape[0] >= LONG_TOKENS:
            function()
    return list(engine.model.encoder.layers)[index].register_forward_pre_hook(pre_hook, prepend=prepend)


def in_thread(function) -> int:
    """``function()``'s result, computed on a new thread (its OpenMP settings are its own)."""
    result: list = []
    thread = threading.Thread(target=lambda: result.append(function()))
    thread.start()
    thread.join(GATE_TIMEOUT_S)
    return result[0]


def test_the_share_splits_the_cores_between_the_threads_computing():
    torchs = torch.get_num_threads()
    share = ThreadShare(4)
    assert share.share() == 4 and share.computing == 0
    inside = threading.Event()
    release = threading.Event()

    def other() -> None:
        with share.step():
            inside.set()
            release.wait(GATE_TIMEOUT_S)

    thread = threading.Thread(target=other)
    thread.start()
    try:
        assert inside.wait(GATE_TIMEOUT_S)
        assert share.share() == 4   # this thread computes nothing yet: the other has them all

        def two_at_once() -> tuple[int, int, int]:
            with share.step():
                with share.step():   # a step inside a step (an urgent one) counts once
                    return share.computing, share.share(), torch.get_num_threads()
        assert in_thread(two_at_once) == (2, 2, 2)
    finally:
        release.set()
        thread.join(GATE_TIMEOUT_S)
    assert share.computing == 0

    def alone() -> int:
        with share.step():
            return torch.get_num_threads()
    try:
        assert in_thread(alone) == 4
    finally:
        # set_num_threads also sets the count new threads start with: this process's again
        torch.set_num_threads(torchs)


def test_new_threads_start_on_every_core_after_steps_shared_them():
    threads = torch.get_num_threads()
    share = ThreadShare(threads * 2)
    both_in, both_fitted = (threading.Barrier(2, timeout=GATE_TIMEOUT_S) for _ in range(2))

    def step() -> int:
        with share.step():
            both_in.wait()     # both compute: each fits to half
            share.fit()
            fitted = torch.get_num_threads()
            both_fitted.wait()
        return fitted
    try:
        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            assert list(pool.map(lambda _: step(), range(2))) == [threads, threads]
        assert share.computing == 0
        assert in_thread(torch.get_num_threads) == threads * 2
    finally:
        torch.set_num_threads(threads)


def test_default_lanes():
    assert default_lanes(1) == 1
    assert default_lanes(2) == default_lanes(16) == 2


def test_two_steps_compute_side_by_side_on_half_the_cores_each(lanes_engine):
    first, second = long_batch(0), long_batch(1)
    alone = [lanes_engine.step(first).wait(), lanes_engine.step(second).wait()]
    threads = lanes_engine._runner._share.threads
    met_first, met_last, recorded = (threading.Barrier(2, timeout=GATE_TIMEOUT_S) for _ in range(3))
    seen: list[tuple[int, int]] = []
    handles = [hook(lanes_engine, 0, met_first.wait), hook(lanes_engine, -1, met_last.wait),
               # after the share's own hook: what the layer runs on; neither goes on (and
               # ends its step) before both have recorded it
               hook(lanes_engine, -1, lambda: seen.append(
                   (torch.get_num_threads(), os.getpriority(os.PRIO_PROCESS, threading.get_native_id()))),
                   prepend=False),
               hook(lanes_engine, -1, recorded.wait, prepend=False)]
    try:
        lazies = [lanes_engine.step(first), lanes_engine.step(second)]   # both wait for the other
        rows = [lazy.wait(GATE_TIMEOUT_S) for lazy in lazies]
    finally:
        for handle in handles:
            handle.remove()
    own_nice = os.getpriority(os.PRIO_PROCESS, 0)
    assert seen == [(max(1, threads // 2), min(19, own_nice + LANE_NICE))] * 2
    assert os.getpriority(os.PRIO_PROCESS, 0) == own_nice   # this thread's stays
    for got, expected in zip(rows, alone, strict=True):
        np.testing.assert_array_equal(got, expected)


def test_a_step_alone_takes_every_core(lanes_engine):
    seen: list[int] = []
    handle = hook(lanes_engine, -1, lambda: seen.append(torch.get_num_threads()), prepend=False)
    try:
        lanes_engine.step(long_batch(2)).wait(GATE_TIMEOUT_S)
    finally:
        handle.remove()
    assert seen == [lanes_engine._runner._share.threads]


def test_on_one_lane_steps_never_overlap(one_lane_engine):
    events: list[str] = []
    handles = [hook(one_lane_engine, 0, lambda: events.append("in")),
               hook(one_lane_engine, -1, lambda: events.append("out"))]
    try:
        lazies = [one_lane_engine.step(long_batch(seed)) for seed in (3, 4, 5)]
        for lazy in lazies:
            lazy.wait(GATE_TIMEOUT_S)
    finally:
        for handle in handles:
            handle.remove()
    assert events == ["in", "out"] * 3


@pytest.mark.parametrize("inline", [False, True])
def test_an_urgent_step_runs_beside_the_step_being_computed(lanes_engine, inline):
    rng = np.random.default_rng(6)
    long = long_batch(7)
    urgent_batch = Batch.from_sequences([rng.integers(5, 1000, 7).tolist() for _ in range(2)])
    alone_long, alone_urgent = lanes_engine.step(long).wait(), lanes_engine.step(urgent_batch).wait()
    preempted_before = lanes_engine.stats()["preempted_steps"]
    entered, release = threading.Event(), threading.Event()
    handle = hook(lanes_engine, 0, lambda: (entered.set(), release.wait(GATE_TIMEOUT_S)))
    result: dict[str, np.ndarray] = {}
    try:
        if inline:   # as a replica's loop computes frames' steps
            worker = threading.Thread(target=lambda: result.update(long=lanes_engine.step(long, inline=True).wait()))
            worker.start()
        else:
            long_lazy = lanes_engine.step(long)
        assert entered.wait(GATE_TIMEOUT_S)
        urgent_rows = lanes_engine.step(urgent_batch, preempt=True).wait(GATE_TIMEOUT_S)   # the long one is held
        release.set()
        if inline:
            worker.join(GATE_TIMEOUT_S)
            long_rows = result["long"]
        else:
            long_rows = long_lazy.wait(GATE_TIMEOUT_S)
    finally:
        release.set()
        handle.remove()
    assert lanes_engine.stats()["preempted_steps"] == preempted_before + 1
    np.testing.assert_array_equal(urgent_rows, alone_urgent)
    np.testing.assert_array_equal(long_rows, alone_long)


def test_lanes_below_one_are_refused(tiny_bert_dir):
    from embedserve.engine import Engine

    with pytest.raises(ValueError, match="lanes must be at least 1"):
        Engine.load(tiny_bert_dir, cpu_lanes=0)
