"""The request pool: calls waiting for rows, and their sequences waiting for a batch.

Owns admission (the bounded queue, in tokens), the FCFS queue of sequences,
and each call's result handle. It does not talk to the engine or to gRPC:
``batcher.py`` takes batches out of it and routes rows back; ``servicer.py``
puts calls in and awaits them.

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
from embedserve.scheduler.policy import BatchPlan, plan_batch
from embedserve.ragged import RaggedBatch

# Why a queued sequence is dropped instead of computed (a metrics label).
CANCELLED = "cancelled"
DEADLINE = "deadline"
FAILED = "failed"


class Call:
    """One Embed or Score RPC: its tokens, its deadline, its result handle."""

    def __init__(self, task: Task, tokens: RaggedBatch, arrival: float,
                 deadline: float | None = None, read_in_bulk: bool = False) -> None:
        self.task = task
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
    """The FCFS queue of sequences, bounded in tokens."""

    def __init__(self, max_queue_tokens: int, clock: Callable[[], float] = time.monotonic) -> None:
        self.max_queue_tokens = max_queue_tokens
        self.queued_tokens = 0
        self._queue: deque[SequenceEntry] = deque()
        self._not_empty = asyncio.Event()
        self._clock = clock

    @property
    def queued_sequences(self) -> int:
        return len(self._queue)

    def admit(self, call: Call) -> None:
        """Queue all of ``call``'s sequences, or raise at once.

        InvalidInput when the call alone exceeds the bound (it could never
        run; split it), Overloaded when it does not fit now (retry later).
        """
        if call.num_tokens > self.max_queue_tokens:
            raise InvalidInput(f"a call of {call.num_tokens} tokens exceeds this replica's queue "
                               f"bound of {self.max_queue_tokens}; split it into smaller calls",
                               field="tokens")
        if self.queued_tokens + call.num_tokens > self.max_queue_tokens:
            raise Overloaded(f"the queue holds {self.queued_tokens} of {self.max_queue_tokens} "
                             f"tokens; a call of {call.num_tokens} does not fit, retry later")
        lengths = call.tokens.lengths.tolist()
        self._queue.extend(SequenceEntry(call, i, n) for i, n in enumerate(lengths))
        self.queued_tokens += call.num_tokens
        self._not_empty.set()

    async def wait_for_work(self) -> None:
        """Return once the queue holds at least one entry (live or not)."""
        await self._not_empty.wait()

    def take(self, token_budget: int, max_sequences: int) -> BatchPlan[SequenceEntry]:
        """Pop the next batch (and the dead entries before and inside it) off the queue."""
        now = self._clock()
        plan = plan_batch(self._queue, token_budget, max_sequences,
                          _entry_length, lambda entry: entry.call.drop_reason(now))
        for _ in range(plan.consumed):
            self.queued_tokens -= self._queue.popleft().length
        if not self._queue:
            self._not_empty.clear()
        return plan
