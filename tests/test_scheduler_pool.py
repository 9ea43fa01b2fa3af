"""The request pool and batch assembly, without a server: admission, drops, routing."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from embedserve import ragged
from embedserve.errors import DeadlineExceeded, InvalidInput, Overloaded
from embedserve.scheduler.batcher import assemble_batch, group_runs
from embedserve.scheduler.pool import CANCELLED, DEADLINE, Call, RequestPool


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def tokens(*sequences: list[int], types: list[list[int]] | None = None) -> ragged.RaggedBatch:
    ids = np.array([t for s in sequences for t in s], dtype=np.int32)
    type_ids = None if types is None else np.array([t for s in types for t in s], dtype=np.int32)
    return ragged.from_lengths(ids, np.array([len(s) for s in sequences]), type_ids)


def run(coroutine_fn):
    return asyncio.run(coroutine_fn())


def test_admission_is_bounded_in_tokens():
    async def body():
        pool = RequestPool(max_queue_tokens=10)
        pool.admit(Call("embed", tokens([1] * 4, [2] * 4), arrival=0.0))
        with pytest.raises(Overloaded):
            pool.admit(Call("embed", tokens([3] * 3), arrival=0.0))
        with pytest.raises(InvalidInput, match="split"):
            pool.admit(Call("embed", tokens([3] * 11), arrival=0.0))
        pool.admit(Call("embed", tokens([3] * 2), arrival=0.0))  # exactly full
        assert (pool.queued_tokens, pool.queued_sequences) == (10, 3)
        plan = pool.take(token_budget=8, max_sequences=8)
        assert [e.length for e in plan.taken] == [4, 4]
        assert (pool.queued_tokens, pool.queued_sequences) == (2, 1)
        pool.admit(Call("embed", tokens([3] * 8), arrival=0.0))  # room again
    run(body)


def test_expired_and_cancelled_calls_are_dropped_when_reached():
    async def body():
        clock = FakeClock()
        pool = RequestPool(max_queue_tokens=100, clock=clock)
        expiring = Call("embed", tokens([1, 1], [1]), arrival=clock.now, deadline=clock.now + 1)
        cancelled = Call("embed", tokens([2, 2]), arrival=clock.now)
        live = Call("embed", tokens([3, 3, 3]), arrival=clock.now, deadline=clock.now + 10)
        for call in (expiring, cancelled, live):
            pool.admit(call)
        cancelled.cancel(CANCELLED)
        clock.now += 2  # past the first call's deadline, not the last one's
        plan = pool.take(token_budget=100, max_sequences=100)
        assert [e.call for e in plan.taken] == [live]
        assert [(e.call, reason) for e, reason in plan.dropped] == [
            (expiring, DEADLINE), (expiring, DEADLINE), (cancelled, CANCELLED)]
        with pytest.raises(DeadlineExceeded):
            expiring.future.result()
        assert cancelled.future.cancelled()
        assert pool.queued_tokens == 0 and pool.queued_sequences == 0
    run(body)


def test_runs_route_rows_back_to_the_right_call_and_position():
    async def body():
        a = Call("embed", tokens([1, 1], [2, 2, 2], [3]), arrival=0.0)
        b = Call("embed", tokens([4], [5, 5]), arrival=0.0)
        pool = RequestPool(max_queue_tokens=100)
        pool.admit(a)
        pool.admit(b)
        first = pool.take(token_budget=5, max_sequences=10).taken   # a0, a1
        second = pool.take(token_budget=100, max_sequences=10).taken  # a2, b0, b1
        runs = group_runs(second)
        assert [(r.call, r.first_index, r.row, r.count) for r in runs] == [(a, 2, 0, 1), (b, 0, 1, 2)]
        batch = assemble_batch(runs, "embed")
        assert batch.token_ids.tolist() == [3, 4, 5, 5] and batch.lengths.tolist() == [1, 1, 2]
        assert batch.token_type_ids is None
        # rows computed as "the first token id" stand in for the engine's output
        for run_ in runs:
            run_.call.deliver(run_.first_index, np.array([[3.0], [4.0], [5.0]])[run_.row:run_.row + run_.count], 0.001)
        assert b.future.result().ravel().tolist() == [4.0, 5.0]
        assert not a.future.done()
        (only,) = group_runs(first)
        only.call.deliver(only.first_index, np.array([[1.0], [2.0]]), 0.002)
        assert a.future.result().ravel().tolist() == [1.0, 2.0, 3.0]
        assert a.compute_s == pytest.approx(0.003)
    run(body)


def test_segment_ids_are_kept_and_zero_filled_for_calls_without_them():
    async def body():
        with_types = Call("score", tokens([1, 2, 3], types=[[0, 1, 1]]), arrival=0.0)
        without = Call("score", tokens([4, 5]), arrival=0.0)
        pool = RequestPool(max_queue_tokens=100)
        pool.admit(with_types)
        pool.admit(without)
        batch = assemble_batch(group_runs(pool.take(100, 10).taken), "score")
        assert batch.task == "score"
        assert batch.token_type_ids.tolist() == [0, 1, 1, 0, 0]
    run(body)


def test_a_failed_call_ignores_late_rows_and_drops_its_queued_rest():
    async def body():
        call = Call("embed", tokens([1], [2]), arrival=0.0)
        pool = RequestPool(max_queue_tokens=100)
        pool.admit(call)
        (entry,) = pool.take(token_budget=1, max_sequences=1).taken
        call.fail(RuntimeError("step failed"))
        call.deliver(entry.index, np.zeros((1, 4)), 0.0)  # late rows: ignored
        with pytest.raises(RuntimeError):
            call.future.result()
        plan = pool.take(token_budget=10, max_sequences=10)
        assert plan.taken == [] and [reason for _, reason in plan.dropped] == ["failed"]
    run(body)


def test_each_priority_class_has_its_own_queue_bound():
    async def body():
        pool = RequestPool(max_queue_tokens=10)
        pool.admit(Call("embed", tokens([1] * 10), arrival=0.0, priority="batch"))
        with pytest.raises(Overloaded, match="batch queue"):
            pool.admit(Call("embed", tokens([2]), arrival=0.0, priority="batch"))
        pool.admit(Call("embed", tokens([3] * 10), arrival=0.0))  # interactive: its own room
        assert (pool.queued_tokens_of("batch"), pool.queued_tokens_of("interactive")) == (10, 10)
        assert pool.queued_tokens == 20
    run(body)


def test_interactive_calls_run_before_batch_calls_queued_earlier():
    async def body():
        clock = FakeClock()
        pool = RequestPool(max_queue_tokens=100, clock=clock, batch_token_cap=4,
                           interactive_window_s=1.0)
        bulk = Call("embed", tokens(*[[7] * 4] * 6), arrival=clock.now, priority="batch")
        pool.admit(bulk)
        # No interactive traffic yet: batch runs at the full budget.
        plan = pool.take(token_budget=12, max_sequences=8)
        assert [(e.call, e.index) for e in plan.taken] == [(bulk, 0), (bulk, 1), (bulk, 2)]
        clock.now += 0.1
        query = Call("embed", tokens([1, 2]), arrival=clock.now)
        pool.admit(query)
        # The query first; beside it only the batch head (the cap, 4 tokens, is its size).
        plan = pool.take(token_budget=12, max_sequences=8)
        assert [(e.call, e.index) for e in plan.taken] == [(query, 0), (bulk, 3)]
        # Within the window after the query: still capped.
        clock.now += 0.5
        plan = pool.take(token_budget=12, max_sequences=8)
        assert [(e.call, e.index) for e in plan.taken] == [(bulk, 4)]
        # Past it: the full budget again.
        clock.now += 1.0
        pool.admit(Call("embed", tokens(*[[7] * 4] * 3), arrival=clock.now, priority="batch"))
        plan = pool.take(token_budget=12, max_sequences=8)
        assert len(plan.taken) == 3 and plan.taken[0].call is bulk
    run(body)
