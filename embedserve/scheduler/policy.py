"""The batching rule: which queued sequences run together in the next step.

A pure function over the queue, no I/O and no clock: the loop that calls it
(``batcher.py``) owns time, the engine and the results. The rule, after TEI's
router queue:

- first come, first served: take entries from the front, never reorder;
- drop entries whose caller is gone (cancelled, deadline passed, failed)
  as they are reached, and report them so they are counted, never computed;
- stop at the first live entry that does not fit, either because its tokens
  would push the batch past ``token_budget`` or because the batch already
  holds ``max_sequences``;
- an entry longer than the whole budget runs alone (first in an empty batch),
  so it cannot starve.

``plan_priority_batch`` applies that rule to two queues, one per traffic class
(docs/priority.md): interactive sequences first in every step, batch sequences
fill the rest; while interactive work is in the step, still waiting, or arrived
recently (the caller says which: it owns the clock), the batch class's tokens in
a step are capped, so an interactive call never waits long behind a running
step; without interactive traffic batch work runs at the full budget. Batch
work is never starved: every step takes the first live batch entry.

``plan_lane_steps`` is the rule where the engine preempts a running step between
its layers (the CPU engine): the classes never share a step. Each class has its
own lane of steps in the engine; an interactive step runs at the next layer
boundary of the batch step being computed, so batch steps need no cap and run at
the full budget, and a lane with room always gets its class's next step, FCFS,
whatever the other class holds (neither starves the other's planning; the engine
bounds what preemption takes from a batch step: one interactive step per layer).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Generic, TypeVar

Entry = TypeVar("Entry")


@dataclass
class BatchPlan(Generic[Entry]):
    """What ``plan_batch`` decided; the caller pops ``consumed`` entries off the front."""

    taken: list[Entry] = field(default_factory=list)
    dropped: list[tuple[Entry, str]] = field(default_factory=list)  # (entry, reason)
    tokens: int = 0

    @property
    def consumed(self) -> int:
        return len(self.taken) + len(self.dropped)


def plan_batch(queue: Iterable[Entry], token_budget: int, max_sequences: int,
               length: Callable[[Entry], int],
               drop_reason: Callable[[Entry], str | None]) -> BatchPlan[Entry]:
    """Plan the next batch from the front of ``queue`` (see the module docstring).

    ``length(e)`` is an entry's token count; ``drop_reason(e)`` is None for a
    live entry, else why it is dropped. ``taken`` plus ``dropped`` is always a
    prefix of the queue, in order. ``taken`` is empty only when the queue
    holds no live entry.
    """
    if token_budget < 1 or max_sequences < 1:
        raise ValueError("token_budget and max_sequences must be >= 1")
    plan: BatchPlan[Entry] = BatchPlan()
    for entry in queue:
        reason = drop_reason(entry)
        if reason is not None:
            plan.dropped.append((entry, reason))
            continue
        n = length(entry)
        if plan.taken and (len(plan.taken) == max_sequences or plan.tokens + n > token_budget):
            break
        plan.taken.append(entry)
        plan.tokens += n
        if plan.tokens >= token_budget:
            break  # full (or a lone oversize entry): nothing more can fit
    return plan


@dataclass
class PriorityPlan(Generic[Entry]):
    """What ``plan_priority_batch`` decided: a plan per class; the step runs
    ``taken`` (the interactive entries, then the batch ones)."""

    interactive: BatchPlan[Entry] = field(default_factory=BatchPlan)
    batch: BatchPlan[Entry] = field(default_factory=BatchPlan)

    @property
    def taken(self) -> list[Entry]:
        return self.interactive.taken + self.batch.taken

    @property
    def dropped(self) -> list[tuple[Entry, str]]:
        return self.interactive.dropped + self.batch.dropped

    @property
    def tokens(self) -> int:
        return self.interactive.tokens + self.batch.tokens


def plan_priority_batch(interactive: Sequence[Entry], batch: Iterable[Entry], token_budget: int,
                        max_sequences: int, batch_token_cap: int, interactive_recent: bool,
                        length: Callable[[Entry], int],
                        drop_reason: Callable[[Entry], str | None]) -> PriorityPlan[Entry]:
    """Plan the next step from the fronts of the two class queues.

    The rule, in order:

    1. The first live batch entry (the *head*), if any, always runs in this step,
       whatever its length: batch work progresses in every step.
    2. Interactive entries, FCFS (``plan_batch``), in the budget left beside the
       head: ``token_budget - len(head)`` tokens, ``max_sequences - 1`` sequences
       (the whole budget when no batch entry is live). The first one runs even when
       it does not fit, as in ``plan_batch``: an interactive call waits for the
       step in the engine, never for the batch queue.
    3. Further batch entries, FCFS, while the step stays within ``token_budget``
       and ``max_sequences`` and, when interactive work is in the step, still
       queued, or ``interactive_recent``, the batch tokens within
       ``batch_token_cap``.

    So a step holds at most ``max(token_budget, first interactive + head)``
    tokens, and while interactive traffic is about, at most
    ``max(batch_token_cap, len(head))`` batch tokens. A head as long as the whole
    budget runs alone. Each class's ``taken`` plus ``dropped`` is a prefix of its
    queue, in order. With ``max_sequences == 1`` a step holds one entry, the
    interactive one while any is live (so only there can batch work wait for
    interactive work to stop). ``interactive`` is read twice: a sequence, such as a deque.
    """
    if token_budget < 1 or max_sequences < 1 or batch_token_cap < 1:
        raise ValueError("token_budget, max_sequences and batch_token_cap must be >= 1")
    plan: PriorityPlan[Entry] = PriorityPlan()
    batch_queue = iter(batch)
    head = _first_live(batch_queue, plan.batch, drop_reason)
    head_tokens = 0 if head is None else length(head)
    if head is None or max_sequences == 1:
        plan.interactive = plan_batch(interactive, token_budget, max_sequences, length, drop_reason)
        if head is None or plan.interactive.taken:
            return plan
    elif head_tokens < token_budget:
        plan.interactive = plan_batch(interactive, token_budget - head_tokens, max_sequences - 1,
                                      length, drop_reason)
    plan.batch.taken.append(head)
    plan.batch.tokens = head_tokens
    if plan.interactive.taken or interactive_recent or \
            _has_live(_after(interactive, plan.interactive.consumed), drop_reason):
        batch_limit = batch_token_cap
    else:
        batch_limit = token_budget
    sequences = len(plan.interactive.taken) + 1
    for entry in batch_queue:
        reason = drop_reason(entry)
        if reason is not None:
            plan.batch.dropped.append((entry, reason))
            continue
        n = length(entry)
        if sequences >= max_sequences or plan.tokens + n > token_budget or \
                plan.batch.tokens + n > batch_limit:
            break
        plan.batch.taken.append(entry)
        plan.batch.tokens += n
        sequences += 1
    return plan


@dataclass
class LanePlan(Generic[Entry]):
    """What ``plan_lane_steps`` decided: up to two steps, one per class; the caller pops
    each part's ``consumed`` entries off its queue."""

    interactive: BatchPlan[Entry] = field(default_factory=BatchPlan)
    batch: BatchPlan[Entry] = field(default_factory=BatchPlan)


def plan_lane_steps(interactive: Iterable[Entry], batch: Iterable[Entry], token_budget: int,
                    max_sequences: int, interactive_room: bool, batch_room: bool,
                    length: Callable[[Entry], int],
                    drop_reason: Callable[[Entry], str | None]) -> LanePlan[Entry]:
    """Plan the next step of each class's lane, for an engine that preempts steps.

    A lane with room (the caller counts its steps in the engine) gets a step of its
    own class alone, ``plan_batch`` over its queue at the full ``token_budget`` and
    ``max_sequences``; a lane without room gets nothing and its queue is left as it
    is. So: FCFS within a class, an interactive sequence never waits for batch
    tokens to share its step, and a batch step is formed whenever its lane has room,
    however much interactive work there is (no starvation).
    """
    if token_budget < 1 or max_sequences < 1:
        raise ValueError("token_budget and max_sequences must be >= 1")
    plan: LanePlan[Entry] = LanePlan()
    if interactive_room:
        plan.interactive = plan_batch(interactive, token_budget, max_sequences, length, drop_reason)
    if batch_room:
        plan.batch = plan_batch(batch, token_budget, max_sequences, length, drop_reason)
    return plan


def _first_live(queue: Iterator[Entry], plan: BatchPlan[Entry],
                drop_reason: Callable[[Entry], str | None]) -> Entry | None:
    """The first live entry of ``queue``; the dead ones before it go to ``plan.dropped``."""
    for entry in queue:
        reason = drop_reason(entry)
        if reason is None:
            return entry
        plan.dropped.append((entry, reason))
    return None


def _after(queue: Iterable[Entry], skip: int) -> Iterator[Entry]:
    entries = iter(queue)
    for _ in range(skip):
        next(entries, None)
    return entries


def _has_live(queue: Iterable[Entry], drop_reason: Callable[[Entry], str | None]) -> bool:
    """Whether ``queue`` holds a live entry (dead ones are left for a later plan to drop)."""
    return any(drop_reason(entry) is None for entry in queue)
