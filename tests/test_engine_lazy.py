"""Engine.step's contract: returns at once, LazyTensor waits or awaits, errors stay per step.

``step(batch, inline=True)`` keeps the same contract except that it computes on the
calling thread, after the steps queued before it, and returns the step finished.
"""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

import numpy as np
import pytest

from embedserve.engine import Batch, Engine, LazyTensor
from embedserve.errors import InvalidInput, Unavailable


@pytest.fixture(scope="module")
def engine(tiny_bert_dir: Path):
    with Engine.load(tiny_bert_dir) as eng:
        yield eng


BAD_BATCHES = [
    (Batch.from_sequences([[0, 250002, 2]]), "outside the vocabulary"),
    (Batch.from_sequences([list(range(4, 4 + 513))]), "the model takes at most 512"),
    (Batch.from_sequences([[0, 5, 2]], task="score"), "does task 'embed'"),
    (Batch(np.array([0, 5, 2], np.int32), np.array([0, 2], np.int32)), "add up to 2"),
    (Batch(np.array([0, 5, 2], np.int32), np.array([1, 3], np.int32)), "cu_seqlens must start at 0"),
    (Batch.from_lengths(np.array([0, 5, 2], np.int32), np.array([3], np.int32),
                        token_type_ids=np.array([0, 2, 0], np.int32)), "token_type_ids must lie"),
]


def _engine_threads() -> set[threading.Thread]:
    return {t for t in threading.enumerate() if t.name.startswith("embedserve-engine")}


def batches(count: int, seed: int = 0) -> list[Batch]:
    rng = np.random.default_rng(seed)
    return [Batch.from_sequences([rng.integers(4, 250002, size=n).astype(np.int32)
                                  for n in rng.integers(1, 200, size=rng.integers(1, 6))])
            for _ in range(count)]


def test_several_steps_in_flight_resolve_in_order(engine: Engine) -> None:
    work = batches(8)
    one_by_one = [engine.step(b).wait() for b in work]
    lazies = [engine.step(b) for b in work]               # all queued before any wait
    assert all(isinstance(lazy, LazyTensor) for lazy in lazies)
    for lazy, expected in zip(lazies, one_by_one):
        result = lazy.wait(timeout=60)
        assert lazy.ready()
        assert result.shape == expected.shape and np.array_equal(result, expected)


def test_await_does_not_block_the_event_loop(engine: Engine) -> None:
    work = batches(4, seed=1)
    expected = [engine.step(b).wait() for b in work]

    async def main() -> tuple[list[np.ndarray], int]:
        lazies = [engine.step(b) for b in work]
        ticks_while_pending = 0

        async def ticker() -> None:
            nonlocal ticks_while_pending
            while True:
                # Counted only while the last step still computes: an await that blocked
                # the loop would let the ticker run only after every step was done.
                ticks_while_pending += not lazies[-1].ready()
                await asyncio.sleep(0)

        gathered = asyncio.gather(*lazies)      # its awaits are scheduled before the ticker
        task = asyncio.create_task(ticker())
        results = await gathered
        task.cancel()
        return results, ticks_while_pending

    results, ticks_while_pending = asyncio.run(main())
    assert ticks_while_pending > 0
    for got, want in zip(results, expected):
        assert np.array_equal(got, want)


@pytest.mark.parametrize("bad, message", BAD_BATCHES)
def test_a_failed_step_raises_from_wait_and_await_and_the_engine_keeps_working(
        engine: Engine, bad: Batch, message: str) -> None:
    good = batches(1, seed=2)[0]
    expected = engine.step(good).wait()
    failing, after = engine.step(bad), engine.step(good)  # the good step queued behind the bad one
    with pytest.raises(InvalidInput, match=message):
        failing.wait()
    with pytest.raises(InvalidInput, match=message):
        asyncio.run(_await(failing))
    assert np.array_equal(after.wait(), expected)


async def _await(lazy: LazyTensor) -> np.ndarray:
    return await lazy


def test_on_ready_calls_the_loop_back_once_the_step_is_done(engine: Engine) -> None:
    good, bad = batches(1, seed=4)[0], Batch.from_sequences([[0, 250002, 2]])
    expected = engine.step(good).wait()

    async def main() -> list[tuple[bool, bool, object]]:
        loop_thread = threading.get_ident()
        seen: list[tuple[bool, bool, object]] = []
        both = asyncio.Event()

        def called_back(lazy: LazyTensor) -> None:
            try:
                outcome: object = lazy.wait(0)
            except InvalidInput as error:
                outcome = error
            seen.append((threading.get_ident() == loop_thread, lazy.ready(), outcome))
            if len(seen) == 2:
                both.set()

        for lazy in (engine.step(good), engine.step(bad)):
            lazy.on_ready(called_back)
        await asyncio.wait_for(both.wait(), 60)
        done = engine.step(good)
        done.wait()
        done.on_ready(called_back)   # already finished: still called back, on the loop
        await asyncio.sleep(0.05)
        return seen

    seen = asyncio.run(main())
    assert [(on_loop, ready) for on_loop, ready, _ in seen] == [(True, True)] * 3
    # The first two ran side by side (the CPU runner's lanes): either may finish first.
    failed = [outcome for _, _, outcome in seen[:2] if isinstance(outcome, InvalidInput)]
    rows = [outcome for _, _, outcome in seen[:2] if not isinstance(outcome, InvalidInput)]
    assert len(failed) == 1 and "outside the vocabulary" in str(failed[0])
    assert np.array_equal(rows[0], expected) and np.array_equal(seen[2][2], expected)


def test_closed_engine_refuses_steps(tiny_bert_dir: Path) -> None:
    engine = Engine.load(tiny_bert_dir)
    engine.close()
    with pytest.raises(Unavailable):
        engine.step(batches(1)[0])


def test_stats_count_steps(tiny_bert_dir: Path) -> None:
    with Engine.load(tiny_bert_dir) as engine:
        work = batches(3, seed=3)
        for b in work:
            engine.step(b).wait()
        with pytest.raises(InvalidInput):
            engine.step(Batch.from_sequences([[0, 300000]])).wait()
        stats = engine.stats()
    assert stats["steps"] == 4 and stats["failed_steps"] == 1
    assert stats["tokens"] == sum(b.num_tokens for b in work)


def test_an_inline_step_is_finished_when_step_returns_and_equals_a_worker_threads(
        engine: Engine, tiny_bert_dir: Path) -> None:
    threads_before = _engine_threads()
    with Engine.load(tiny_bert_dir) as fresh:
        for batch in batches(6, seed=5):
            lazy = fresh.step(batch, inline=True)
            assert lazy.ready()
            assert np.array_equal(lazy.wait(0), engine.step(batch).wait())
        assert _engine_threads() == threads_before   # computed here: no worker thread started


def test_an_inline_step_runs_after_the_steps_queued_before_it(engine: Engine) -> None:
    work = batches(5, seed=7)
    expected = [engine.step(b).wait() for b in work]
    queued = [engine.step(b) for b in work[:-1]]
    last = engine.step(work[-1], inline=True)
    assert last.ready() and all(lazy.ready() for lazy in queued)
    for lazy, want in zip([*queued, last], expected):
        assert np.array_equal(lazy.wait(0), want)


@pytest.mark.parametrize("bad, message", BAD_BATCHES)
def test_a_failed_inline_step_raises_from_wait_not_from_step(engine: Engine, bad: Batch,
                                                              message: str) -> None:
    failed_before = engine.stats()["failed_steps"]
    failing = engine.step(bad, inline=True)
    assert failing.ready()
    with pytest.raises(InvalidInput, match=message):
        failing.wait(0)
    good = batches(1, seed=6)[0]
    assert np.array_equal(engine.step(good, inline=True).wait(0), engine.step(good).wait())
    assert engine.stats()["failed_steps"] == failed_before + 1
