"""The request pool: calls waiting for rows, and their sequences waiting for a batch.

Owns admission (the bounded queues, in tokens), a FCFS queue of sequences per
traffic class (``interactive`` and ``batch``, docs/priority.md; each class has
its own bound, so a bulk job filling its queue never refuses an interactive
call), when interactive work last arrived, and each call's result handle. It
does not talk to the engine or to gRPC: ``batcher.py`` takes batches out of it
and routes rows back; ``servicer.py`` puts calls in and awaits them.

Every call has one ``asyncio.Future`` resolved exactly once: with its rows,
with the error of a failed step, or when its caller goes away. A call that
is gone leaves its sequences in the queue; the batcher drops them unrun when
it reaches them (they stay counted against the bound until then, so memory
stays bounded however fast callers come and go).
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable

import numpy as np

from embedserve.engine.batch import Task
from embedserve.errors import DeadlineExceeded, InvalidInput, Overloaded
from embedserve.link.wire import BATCH, INTERACTIVE
from embedserve.ragged import RaggedBatch
from embedserve.scheduler.policy import LanePlan, PriorityPlan, plan_lane_steps, plan_priority_batch

# Why a queued sequence is dropped instead of computed (a metrics label).
CANCELLED = "cancelled"
DEADLINE = "deadline"
FAILED = "failed"


class Call:
    """One Embed or Score RPC: its tokens, its deadline, its result handle."""

    def __init__(self, task: Task, tokens: RaggedBatch, arrival: float,
                 deadline: float | None = None, read_in_bulk: bool = False,
                 priority: str = INTERACTIVE, token_states: bool = False,
                 key_lengths: np.ndarray | None = None) -> None:
        self.task = task
        # An embedding call that wants every token's last hidden state, not the pooled
        # vector (TEI's /embed_all for an embedder): its step returns both (engine/token_rows.py).
        self.token_states = token_states
        # int32 [B]: keys each sequence attends to (ColBERT query expansion; engine/batch.py)
        self.key_lengths = key_lengths
        self.priority = priority             # INTERACTIVE or BATCH (embedserve.link.wire)
        # Its transport reads every call that arrived while the loop was busy in one
        # turn (frames); gRPC hands them over about one per turn (batcher.py).
        self.read_in_bulk = read_in_bulk
        self.tokens = tokens
        self.arrival = arrival               # time.monotonic() seconds
        self.deadline = deadline             # absolute monotonic seconds, or None
        self.future: asyncio.Future[np.ndarray] = asyncio.get_running_loop().create_future()
        self.rows: np.ndarray | None = None  # [B, dim] or [B], filled as batches finish
        self.remaining = tokens.num_sequences
        self.first_batched_at: float | None = None
        self.compute_s = 0.0
        self.wake_s = 0.0
        self.gone_reason: str | None = None  # set once: CANCELLED, DEADLINE or FAILED
        # The engine steps that carried its rows (otel.StepRecord tuples), kept only
        # while the call is traced (None: not traced, the batcher records nothing).
        self.steps: list[tuple[float, float, int, int, int, int]] | None = None

    @property
    def num_tokens(self) -> int:
        return self.tokens.num_tokens

    def drop_reason(self, now: float) -> str | None:
        """None while someone waits for this call's rows; else why not to compute them."""
        if self.gone_reason is None and self.deadline is not None and now >= self.deadline:
            self.fail(DeadlineExceeded("the deadline passed while the call was queued"), DEADLINE)
        return self.gone_reason

    def deliver(self, start: int, rows: np.ndarray, compute_s: float, wake_s: float = 0.0) -> None:
        """Place ``rows`` (results for sequences start, start+1, ...) into the answer.

        ``wake_s``: of ``compute_s``, the engine-thread -> event-loop hop."""
        if self.future.done():
            return  # failed or cancelled meanwhile; the rows are not wanted
        if self.rows is None:
            self.rows = np.empty((self.tokens.num_sequences, *rows.shape[1:]), dtype=rows.dtype)
        self.rows[start:start + rows.shape[0]] = rows
        self.compute_s += compute_s
        self.wake_s += wake_s
        self.remaining -= rows.shape[0]
        if self.remaining == 0:
            self.future.set_result(self.rows)

    def fail(self, error: BaseException, reason: str = FAILED) -> None:
        """Resolve with ``error`` (first resolution wins) and mark the call gone."""
        if self.gone_reason is None and not self.future.done():
            self.gone_reason = reason
            self.future.set_exception(error)
            self.future.exception()  # mark retrieved: a gone caller may never read it

    def cancel(self, reason: str) -> None:
        """The caller went away (client cancel or deadline seen by gRPC).

        Cancelling the handler task has usually cancelled ``future`` already
        (asyncio cancels what a task awaits), so only ``gone_reason`` says
        the remaining sequences are unwanted.
        """
        if self.gone_reason is None:
            self.gone_reason = reason
            self.future.cancel()


class SequenceEntry:
    """One queued sequence: sequence ``index`` of ``call``."""

    __slots__ = ("call", "index", "length")

    def __init__(self, call: Call, index: int, length: int) -> None:
        self.call = call
        self.index = index
        self.length = length


def _entry_length(entry: SequenceEntry) -> int:
    return entry.length


class RequestPool:
    """A FCFS queue of sequences per class, each bounded in tokens.

    ``batch_token_cap`` and ``interactive_window_s``: while interactive work is
    queued or arrived less than ``interactive_window_s`` ago, a step carries at
    most ``batch_token_cap`` batch tokens (``policy.plan_priority_batch``).
    """

    def __init__(self, max_queue_tokens: int, clock: Callable[[], float] = time.monotonic,
                 batch_token_cap: int | None = None, interactive_window_s: float = 0.0) -> None:
        self.max_queue_tokens = max_queue_tokens
        self.batch_token_cap = batch_token_cap
        self.interactive_window_s = interactive_window_s
        self._queues: dict[str, deque[SequenceEntry]] = {INTERACTIVE: deque(), BATCH: deque()}
        self._queued_tokens = {INTERACTIVE: 0, BATCH: 0}
        self._last_interactive: float | None = None   # arrival of the latest interactive call
        self._not_empty = asyncio.Event()
        # Set when an interactive call is admitted; the batcher clears it before waiting.
        self.interactive_arrived = asyncio.Event()
        self.batch_arrived = asyncio.Event()   # the same for batch calls
        self._clock = clock

    @property
    def queued_tokens(self) -> int:
        return sum(self._queued_tokens.values())

    @property
    def queued_sequences(self) -> int:
        return sum(len(queue) for queue in self._queues.values())

    def queued_tokens_of(self, priority: str) -> int:
        return self._queued_tokens[priority]

    def admit(self, call: Call) -> None:
        """Queue all of ``call``'s sequences in its class's queue, or raise at once.

        InvalidInput when the call alone exceeds the bound (it could never
        run; split it), Overloaded when it does not fit its class's queue now
        (retry later).
        """
        if call.num_tokens > self.max_queue_tokens:
            raise InvalidInput(f"a call of {call.num_tokens} tokens exceeds this replica's queue "
                               f"bound of {self.max_queue_tokens}; split it into smaller calls",
                               field="tokens")
        queued = self._queued_tokens[call.priority]
        if queued + call.num_tokens > self.max_queue_tokens:
            raise Overloaded(f"the {call.priority} queue holds {queued} of {self.max_queue_tokens} "
                             f"tokens; a call of {call.num_tokens} does not fit, retry later")
        lengths = call.tokens.lengths.tolist()
        self._queues[call.priority].extend(SequenceEntry(call, i, n) for i, n in enumerate(lengths))
        self._queued_tokens[call.priority] = queued + call.num_tokens
        if call.priority == INTERACTIVE:
            self._last_interactive = call.arrival
            self.interactive_arrived.set()
        else:
            self.batch_arrived.set()
        self._not_empty.set()

    async def wait_for_work(self) -> None:
        """Return once a queue holds at least one entry (live or not)."""
        await self._not_empty.wait()

    def interactive_recent(self, now: float) -> bool:
        """Whether an interactive call arrived less than ``interactive_window_s`` before ``now``."""
        return self._last_interactive is not None and \
            now - self._last_interactive < self.interactive_window_s

    def holds_only_batch_work(self) -> bool:
        """Whether the interactive queue is empty and the batch queue is not."""
        return not self._queues[INTERACTIVE] and bool(self._queues[BATCH])

    def take(self, token_budget: int, max_sequences: int) -> PriorityPlan[SequenceEntry]:
        """Pop the next batch (and the dead entries before and inside it) off the queues."""
        now = self._clock()
        recent = self.interactive_recent(now)
        plan = plan_priority_batch(self._queues[INTERACTIVE], self._queues[BATCH], token_budget,
                                   max_sequences, self.batch_token_cap or token_budget, recent,
                                   _entry_length, lambda entry: entry.call.drop_reason(now))
        self._pop(plan)
        return plan

    def take_lanes(self, token_budget: int, max_sequences: int, interactive_room: bool,
                   batch_room: bool) -> LanePlan[SequenceEntry]:
        """Pop the next step of each class with room (``policy.plan_lane_steps``: for an
        engine that preempts its steps, each class in steps of its own)."""
        now = self._clock()
        plan = plan_lane_steps(self._queues[INTERACTIVE], self._queues[BATCH], token_budget,
                               max_sequences, interactive_room, batch_room, _entry_length,
                               lambda entry: entry.call.drop_reason(now))
        self._pop(plan)
        return plan

    def holds(self, priority: str) -> bool:
        """Whether the class's queue holds an entry (live or not)."""
        return bool(self._queues[priority])

    def _pop(self, plan: PriorityPlan[SequenceEntry] | LanePlan[SequenceEntry]) -> None:
        for priority, part in ((INTERACTIVE, plan.interactive), (BATCH, plan.batch)):
            queue = self._queues[priority]
            for _ in range(part.consumed):
                self._queued_tokens[priority] -= queue.popleft().length
        if not any(self._queues.values()):
            self._not_empty.clear()
