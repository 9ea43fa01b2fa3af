"""The two-class batching rules (embedserve.scheduler.policy.plan_priority_batch, and
plan_lane_steps where the engine preempts steps):
table cases and properties (docs/priority.md)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from embedserve.scheduler.policy import plan_batch, plan_lane_steps, plan_priority_batch

# An entry is (name, length, drop_reason or None); interactive names start with "i",
# batch names with "b".


def plan(interactive, batch, budget, max_sequences=100, cap=None, recent=False):
    return plan_priority_batch(interactive, batch, budget, max_sequences,
                               cap if cap is not None else budget, recent,
                               length=lambda e: e[1], drop_reason=lambda e: e[2])


def queue(prefix, lengths, dead=()):
    return [(f"{prefix}{k}", n, "cancelled" if k in dead else None) for k, n in enumerate(lengths)]


def names(entries):
    return [e[0] for e in entries]


@pytest.mark.parametrize("interactive, batch, budget, max_sequences, cap, recent, taken", [
    # No interactive traffic at all: batch runs at the full budget (FCFS, as plan_batch).
    ([], [4, 4, 4], 10, 8, 4, False, ["b0", "b1"]),
    # Interactive queued: it goes first, the batch head always joins, the cap bounds the rest.
    ([2, 2], [3, 3, 3], 16, 8, 4, False, ["i0", "i1", "b0"]),
    ([2], [1, 1, 1, 1, 1], 16, 8, 3, False, ["i0", "b0", "b1", "b2"]),
    # Interactive arrived recently (none queued): the cap still holds.
    ([], [3, 3, 3], 16, 8, 4, True, ["b0"]),
    ([], [1, 1, 1, 1, 1], 16, 8, 2, True, ["b0", "b1"]),
    # The batch head runs even when it is longer than the cap.
    ([2], [9, 1], 16, 8, 4, False, ["i0", "b0"]),
    # Interactive work takes the budget beside the head, FCFS (stops at the first misfit).
    ([4, 4, 4], [3], 10, 8, 10, False, ["i0", "b0"]),
    ([3, 3, 3], [3], 10, 8, 10, False, ["i0", "i1", "b0"]),
    # The first interactive entry runs even where it does not fit beside the head.
    ([9], [4], 10, 8, 10, False, ["i0", "b0"]),
    # A batch head as long as the whole budget runs alone.
    ([2], [12], 10, 8, 10, False, ["b0"]),
    # The sequence cap: one sequence left for the batch head.
    ([1, 1, 1], [1, 1], 100, 3, 100, False, ["i0", "i1", "b0"]),
    # One sequence per step: interactive first while any is live.
    ([1], [1], 100, 1, 100, False, ["i0"]),
    ([], [1, 1], 100, 1, 100, True, ["b0"]),
    # Only interactive work: exactly plan_batch.
    ([4, 4, 4], [], 10, 8, 2, True, ["i0", "i1"]),
])
def test_priority_table(interactive, batch, budget, max_sequences, cap, recent, taken):
    result = plan(queue("i", interactive), queue("b", batch), budget, max_sequences, cap, recent)
    assert names(result.taken) == taken
    assert result.tokens == sum(e[1] for e in result.taken)


def test_gone_entries_of_both_classes_are_dropped_and_a_dead_interactive_queue_lifts_the_cap():
    interactive = queue("i", [2, 2], dead={0, 1})
    batch = queue("b", [3, 3, 3, 3], dead={0, 2})
    result = plan(interactive, batch, 20, cap=3)
    # No live interactive work and none recent: batch runs at the full budget.
    assert names(result.taken) == ["b1", "b3"]
    assert [e[0] for e, _ in result.dropped] == ["i0", "i1", "b0", "b2"]
    assert (result.interactive.consumed, result.batch.consumed) == (2, 4)


def test_live_interactive_work_left_queued_keeps_the_cap():
    # The second interactive entry does not fit this step; it still bounds the batch tokens.
    result = plan(queue("i", [6, 6]), queue("b", [1, 1, 1, 1]), 10, cap=2)
    assert names(result.taken) == ["i0", "b0", "b1"]


def test_bad_limits_are_rejected():
    for budget, max_sequences, cap in ((0, 1, 1), (1, 0, 1), (1, 1, 0)):
        with pytest.raises(ValueError):
            plan([], [], budget, max_sequences, cap)


entry_lists = st.lists(st.tuples(st.integers(1, 40), st.booleans()), max_size=20)


def build(prefix, spec):
    return [(f"{prefix}{k}", n, "cancelled" if dead else None) for k, (n, dead) in enumerate(spec)]


@settings(max_examples=400, deadline=None)
@given(interactive=entry_lists, batch=entry_lists, budget=st.integers(1, 100),
       max_sequences=st.integers(1, 12), cap=st.integers(1, 100), recent=st.booleans())
def test_properties(interactive, batch, budget, max_sequences, cap, recent):
    iq, bq = build("i", interactive), build("b", batch)
    result = plan(iq, bq, budget, max_sequences, cap, recent)
    i_live = [e for e in iq if e[2] is None]
    b_live = [e for e in bq if e[2] is None]
    i_part, b_part = result.interactive, result.batch
    for part, whole in ((i_part, iq), (b_part, bq)):
        # FCFS within a class: taken + dropped is a prefix of the queue, in order; every
        # dead entry in it is dropped, every live one taken.
        consumed = whole[:part.consumed]
        assert sorted(part.taken + [e for e, _ in part.dropped]) == sorted(consumed)
        assert part.taken == [e for e in consumed if e[2] is None]
        assert all(reason == e[2] for e, reason in part.dropped)
        assert part.tokens == sum(e[1] for e in part.taken)
    # Interactive sequences first in the step.
    assert result.taken == i_part.taken + b_part.taken
    # No starvation: with two sequences a step, batch work progresses in every step;
    # interactive work does in every step too.
    if b_live and max_sequences >= 2:
        assert b_part.taken and b_part.taken[0] is b_live[0]
    if i_live and not (b_live and b_live[0][1] >= budget):
        assert i_part.taken and i_part.taken[0] is i_live[0]
    if not i_live and b_live:
        assert b_part.taken
    assert len(result.taken) <= max_sequences
    # The step stays within the budget, but for its first interactive and first batch entry.
    firsts = (i_part.taken[0][1] if i_part.taken else 0) + (b_part.taken[0][1] if b_part.taken else 0)
    assert result.tokens <= max(budget, firsts)
    # While interactive work is in the step, queued, or recent: batch tokens within the
    # cap, but for the batch head.
    interactive_about = recent or bool(i_live)
    if interactive_about and b_part.taken:
        assert b_part.tokens <= max(cap, b_part.taken[0][1])
    # Without interactive traffic the batch class gets exactly FCFS at the full budget.
    if not interactive_about:
        fcfs = plan_batch(bq, budget, max_sequences, lambda e: e[1], lambda e: e[2])
        assert b_part.taken == fcfs.taken


@settings(max_examples=100, deadline=None)
@given(interactive=st.lists(st.integers(1, 30), max_size=15),
       batch=st.lists(st.integers(1, 30), min_size=1, max_size=15),
       budget=st.integers(30, 100), max_sequences=st.integers(2, 8), cap=st.integers(1, 60))
def test_every_entry_runs_within_a_bounded_number_of_steps(interactive, batch, budget,
                                                           max_sequences, cap):
    """Step the plan until both queues are empty, interactive work arriving all along:
    batch work finishes within as many steps as it has entries."""
    iq, bq = queue("i", interactive), queue("b", batch)
    for _step in range(len(batch)):
        result = plan(iq + queue("n", [5]), bq, budget, max_sequences, cap, recent=True)
        iq = (iq + queue("n", [5]))[result.interactive.consumed:]
        bq = bq[result.batch.consumed:]
        if not bq:
            break
    assert bq == []


# plan_lane_steps: the rule where the engine preempts steps between layers (each class
# in steps of its own; interactive steps run inside the batch step being computed).

def lanes(interactive, batch, budget, max_sequences=100, interactive_room=True, batch_room=True):
    return plan_lane_steps(interactive, batch, budget, max_sequences, interactive_room, batch_room,
                           length=lambda e: e[1], drop_reason=lambda e: e[2])


@pytest.mark.parametrize("interactive, batch, budget, max_sequences, rooms, steps", [
    # Each class alone in its step, both at the full budget (no cap on batch tokens).
    ([2, 2], [4, 4, 4], 10, 8, (True, True), (["i0", "i1"], ["b0", "b1"])),
    ([], [4, 4, 4], 12, 8, (True, True), ([], ["b0", "b1", "b2"])),
    # A lane without room gets no step and its queue is left alone.
    ([2], [4], 10, 8, (False, True), ([], ["b0"])),
    ([2], [4], 10, 8, (True, False), (["i0"], [])),
    # FCFS within a class: stop at the first misfit; a lone oversize entry runs alone.
    ([4, 9, 1], [12, 1], 10, 8, (True, True), (["i0"], ["b0"])),
    ([1, 1, 1], [1, 1, 1], 100, 2, (True, True), (["i0", "i1"], ["b0", "b1"])),
])
def test_lane_table(interactive, batch, budget, max_sequences, rooms, steps):
    result = lanes(queue("i", interactive), queue("b", batch), budget, max_sequences, *rooms)
    assert (names(result.interactive.taken), names(result.batch.taken)) == steps


def test_lanes_refuse_bad_limits():
    for budget, max_sequences in ((0, 1), (1, 0)):
        with pytest.raises(ValueError):
            lanes([], [], budget, max_sequences)


@settings(max_examples=200, deadline=None)
@given(interactive=entry_lists, batch=entry_lists, budget=st.integers(1, 100),
       max_sequences=st.integers(1, 12), interactive_room=st.booleans(), batch_room=st.booleans())
def test_lane_properties(interactive, batch, budget, max_sequences, interactive_room, batch_room):
    iq, bq = build("i", interactive), build("b", batch)
    result = lanes(iq, bq, budget, max_sequences, interactive_room, batch_room)
    for part, whole, room in ((result.interactive, iq, interactive_room),
                              (result.batch, bq, batch_room)):
        # A lane without room consumes nothing; with room, exactly FCFS at the full budget:
        # the other class's queue never changes what it takes (no starvation either way).
        fcfs = plan_batch(whole, budget, max_sequences, lambda e: e[1], lambda e: e[2])
        assert (part.taken, part.dropped) == ((fcfs.taken, fcfs.dropped) if room else ([], []))
        # FCFS: taken + dropped is a prefix of the class's queue, in order.
        consumed = whole[:part.consumed]
        assert part.taken == [e for e in consumed if e[2] is None]
        live = [e for e in whole if e[2] is None]
        if room and live:
            assert part.taken[0] is live[0]
        assert len(part.taken) <= max_sequences
        assert part.tokens <= max(budget, part.taken[0][1] if part.taken else 0)
    # Never a step of mixed classes.
    assert all(e[0].startswith("i") for e in result.interactive.taken)
    assert all(e[0].startswith("b") for e in result.batch.taken)


@settings(max_examples=100, deadline=None)
@given(batch=st.lists(st.integers(1, 30), min_size=1, max_size=15), budget=st.integers(30, 100),
       max_sequences=st.integers(1, 8), depth=st.integers(1, 3))
def test_batch_lanes_finish_while_interactive_work_arrives_all_along(batch, budget, max_sequences, depth):
    """A batch step a turn, interactive work arriving before every plan, the interactive lane
    sometimes full: batch work finishes within as many plans as it has entries."""
    bq = queue("b", batch)
    iq: list = []
    for turn in range(len(batch)):
        iq = iq + queue("n", [5])
        result = lanes(iq, bq, budget, max_sequences, interactive_room=turn % 2 == 0,
                       batch_room=True)
        iq, bq = iq[result.interactive.consumed:], bq[result.batch.consumed:]
        if not bq:
            break
    assert bq == []
