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
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
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
