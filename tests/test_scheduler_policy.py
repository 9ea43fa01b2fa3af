"""The batching rule (embedserve.scheduler.policy.plan_batch): table cases and properties."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from embedserve.scheduler.policy import plan_batch

# An entry in these tests is (name, length, drop_reason or None).


def plan(queue, budget, max_sequences=100):
    return plan_batch(queue, budget, max_sequences, length=lambda e: e[1], drop_reason=lambda e: e[2])


def names(entries):
    return [e[0] for e in entries]


@pytest.mark.parametrize("lengths, budget, max_sequences, taken", [
    ([], 10, 4, []),                           # empty queue: nothing
    ([3, 3, 3], 10, 4, ["e0", "e1", "e2"]),    # all fit
    ([4, 4, 4], 10, 4, ["e0", "e1"]),          # the third would exceed 10
    ([4, 6, 1], 10, 4, ["e0", "e1"]),          # exactly the budget, then full
    ([4, 7, 1], 10, 4, ["e0"]),                # stop at the first misfit: no skipping ahead to 1
    ([25, 1], 10, 4, ["e0"]),                  # a lone oversize sequence runs alone
    ([1, 25], 10, 4, ["e0"]),                  # ... but never joins a non-empty batch
    ([1, 1, 1, 1, 1], 10, 2, ["e0", "e1"]),    # sequence limit
])
def test_fcfs_table(lengths, budget, max_sequences, taken):
    queue = [(f"e{i}", n, None) for i, n in enumerate(lengths)]
    result = plan(queue, budget, max_sequences)
    assert names(result.taken) == taken
    assert result.dropped == []
    assert result.tokens == sum(e[1] for e in result.taken)


def test_gone_entries_are_dropped_with_their_reason_and_skipped():
    queue = [("a", 5, "cancelled"), ("b", 4, None), ("c", 9, "deadline"), ("d", 6, None),
             ("e", 3, None)]
    result = plan(queue, 10)
    assert names(result.taken) == ["b", "d"]
    assert [(e[0], reason) for e, reason in result.dropped] == [("a", "cancelled"), ("c", "deadline")]
    assert result.consumed == 4  # e stays queued


def test_only_gone_entries_gives_an_empty_batch_and_drops_them_all():
    queue = [("a", 5, "cancelled"), ("b", 50, "failed")]
    result = plan(queue, 10)
    assert result.taken == [] and result.consumed == 2


def test_bad_limits_are_rejected():
    with pytest.raises(ValueError):
        plan([("a", 1, None)], 0)
    with pytest.raises(ValueError):
        plan([("a", 1, None)], 10, max_sequences=0)


entries_strategy = st.lists(
    st.tuples(st.integers(1, 40), st.sampled_from([None, None, None, "cancelled", "deadline"])),
    max_size=40)


@settings(max_examples=300, deadline=None)
@given(entries=entries_strategy, budget=st.integers(1, 64), max_sequences=st.integers(1, 8))
def test_properties(entries, budget, max_sequences):
    queue = [(i, n, reason) for i, (n, reason) in enumerate(entries)]
    result = plan(queue, budget, max_sequences)
    taken, dropped = result.taken, [e for e, _ in result.dropped]

    # Nothing lost, nothing duplicated, order kept: taken + dropped is exactly
    # the consumed prefix of the queue, each in queue order.
    consumed = queue[:result.consumed]
    assert sorted(taken + dropped) == consumed
    assert names(taken) == sorted(names(taken)) and names(dropped) == sorted(names(dropped))
    # Only gone entries are dropped; only live ones are taken.
    assert all(e[2] is not None for e in dropped) and all(e[2] is None for e in taken)
    # The budget holds, except for a lone oversize sequence.
    assert len(taken) <= max_sequences
    assert result.tokens == sum(e[1] for e in taken)
    assert result.tokens <= budget or len(taken) == 1
    # Something runs whenever a live entry is waiting.
    live = [e for e in queue if e[2] is None]
    assert bool(taken) == bool(live)
    # Maximal: the next entry left in the queue, if any, did not fit (FCFS
    # stops there rather than skipping ahead to a smaller one).
    rest = queue[result.consumed:]
    if rest and taken:
        nxt = rest[0]
        assert nxt[2] is None or result.tokens >= budget or len(taken) == max_sequences
        if nxt[2] is None:
            assert len(taken) == max_sequences or result.tokens + nxt[1] > budget
