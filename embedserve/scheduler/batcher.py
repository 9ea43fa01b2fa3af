"""The batching loop: takes batches out of the pool, steps the engine, routes rows back.

Owns the overlap of CPU and engine work and nothing about gRPC. Up to
``in_flight_depth`` steps are in the engine at once: while one runs, the next
batch is already formed and submitted, so the engine never waits for Python.
Each step's LazyTensor calls the loop back when it resolves (``on_ready``:
``call_soon_threadsafe`` from the engine thread; nothing polls, and no task
per step, whose wake-up would cost a turn of the loop before the rows reach
their calls). Then consecutive rows of one call are copied back in one slice;
when the step failed, every call in the batch fails with the error and the
loop keeps going.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from embedserve.engine.batch import Batch, Task
from embedserve.engine.lazy import LazyTensor
from embedserve.model.info import ModelInfo
from embedserve.errors import DeviceLost
from embedserve.scheduler.metrics import SchedulerMetrics
from embedserve.scheduler.pool import Call, RequestPool, SequenceEntry

log = logging.getLogger(__name__)


class StepEngine(Protocol):
    """What the scheduler needs of an engine (``embedserve.engine.Engine`` has it)."""

    info: ModelInfo

    def step(self, batch: Batch) -> LazyTensor: ...

    def stats(self) -> Mapping[str, float]: ...


@dataclass(frozen=True)
class Run:
    """Consecutive sequences of one call inside a batch: rows [row, row+count)."""

    call: Call
    first_index: int  # the call's sequence index of the first row
    row: int
    count: int


def group_runs(entries: list[SequenceEntry]) -> list[Run]:
    """Merge consecutive entries of the same call (they are adjacent in FCFS order)."""
    runs: list[Run] = []
    row = 0
    for entry in entries:
        last = runs[-1] if runs else None
        if last is not None and last.call is entry.call and \
                last.first_index + last.count == entry.index:
            runs[-1] = Run(last.call, last.first_index, last.row, last.count + 1)
        else:
            runs.append(Run(entry.call, entry.index, row, 1))
        row += 1
    return runs


def assemble_batch(runs: list[Run], task: Task) -> Batch:
    """One packed Batch from the runs' token slices, in batch order."""
    if len(runs) == 1 and runs[0].first_index == 0 \
            and runs[0].count == runs[0].call.tokens.num_sequences:
        return Batch.of(runs[0].call.tokens, task)  # one whole call: its arrays as they are
    id_parts, type_parts, length_parts = [], [], []
    any_types = any(run.call.tokens.token_type_ids is not None for run in runs)
    for run in runs:
        part = run.call.tokens.slice(run.first_index, run.first_index + run.count)
        id_parts.append(part.token_ids)
        length_parts.append(part.lengths)
        if any_types:
            type_parts.append(part.token_type_ids if part.token_type_ids is not None
                              else np.zeros(part.num_tokens, dtype=np.int32))
    return Batch.from_lengths(np.concatenate(id_parts), np.concatenate(length_parts), task,
                              np.concatenate(type_parts) if any_types else None)


class Batcher:
    """Forms, submits and finishes engine steps between ``start()`` and ``stop()``."""

    def __init__(self, engine: StepEngine, pool: RequestPool, task: Task, token_budget: int,
                 max_sequences: int, in_flight_depth: int, metrics: SchedulerMetrics,
                 clock: Callable[[], float] = time.monotonic,
                 on_device_lost: Callable[[DeviceLost], None] | None = None) -> None:
        self._engine = engine
        self._pool = pool
        self._task = task
        self._token_budget = token_budget
        self._max_sequences = max_sequences
        self._slots = asyncio.Semaphore(in_flight_depth)
        self._metrics = metrics
        self._clock = clock
        self._on_device_lost = on_device_lost
        self._in_flight: set[LazyTensor] = set()
        self._engine_free_at = 0.0  # when the engine finished its last step (monotonic)
        self._run_task: asyncio.Task | None = None

    @property
    def in_flight(self) -> int:
        """Steps submitted to the engine and not yet finished."""
        return len(self._in_flight)

    async def stop(self) -> None:
        """Cancel the loop and stop waiting for the steps still in the engine (after a
        drain there are none): their rows reach nobody."""
        self._in_flight.clear()
        if self._run_task is not None:
            self._run_task.cancel()
            await asyncio.gather(self._run_task, return_exceptions=True)

    def start(self) -> None:
        self._run_task = asyncio.create_task(self._run(), name="embedserve-batcher")
        self._run_task.add_done_callback(_report_crash)

    async def _run(self) -> None:
        while True:
            await self._slots.acquire()
            try:
                runs = await self._next_runs()
            except BaseException:
                self._slots.release()
                raise
            self._submit(runs)

    async def _next_runs(self) -> list[Run]:
        while True:
            await self._pool.wait_for_work()
            plan = self._pool.take(self._token_budget, self._max_sequences)
            for entry, reason in plan.dropped:
                self._metrics.sequences_dropped.labels(reason).inc()
            if plan.taken:
                self._metrics.batch_sequences.observe(len(plan.taken))
                self._metrics.batch_tokens.observe(plan.tokens)
                return group_runs(plan.taken)

    def _submit(self, runs: list[Run]) -> None:
        now = self._clock()
        for run in runs:
            if run.call.first_batched_at is None:
                run.call.first_batched_at = now
                self._metrics.queue_seconds.observe(now - run.call.arrival)
        try:
            lazy = self._engine.step(assemble_batch(runs, self._task))
        except Exception as error:  # a step that cannot even start fails like one that ran
            self._fail(runs, error)
            self._slots.release()
            return
        self._in_flight.add(lazy)
        lazy.on_ready(lambda done: self._step_done(done, runs, now))

    def _step_done(self, lazy: LazyTensor, runs: list[Run], submitted_at: float) -> None:
        if lazy not in self._in_flight:
            return   # stopped meanwhile
        self._in_flight.discard(lazy)
        try:
            self._finish(lazy, runs, submitted_at)
        finally:
            self._slots.release()

    def _finish(self, lazy: LazyTensor, runs: list[Run], submitted_at: float) -> None:
        try:
            rows = lazy.wait(0)
        except Exception as error:
            self._fail(runs, error)
            return
        expected = runs[-1].row + runs[-1].count
        if rows.shape[0] != expected:  # never route a wrong-sized result to anyone
            self._fail(runs, RuntimeError(f"the engine returned {rows.shape[0]} rows "
                                          f"for {expected} sequences"))
            return
        finished_at = self._clock()
        # Steps run one after another in the engine: this one's own compute
        # began when it was submitted or when the previous one finished.
        compute_s = finished_at - max(submitted_at, self._engine_free_at)
        # The part of it between the engine finishing and this callback running.
        wake_s = 0.0 if lazy.ready_at is None else min(compute_s, max(0.0, time.monotonic() - lazy.ready_at))
        self._engine_free_at = finished_at
        self._metrics.step_seconds.observe(compute_s)
        for run in runs:
            run.call.deliver(run.first_index, rows[run.row:run.row + run.count], compute_s, wake_s)

    def _fail(self, runs: list[Run], error: Exception) -> None:
        log.error("engine step of %d calls failed", len(runs), exc_info=error)
        self._metrics.steps_failed.inc()
        for run in runs:
            run.call.fail(error)
        if isinstance(error, DeviceLost) and self._on_device_lost is not None:
            self._on_device_lost(error)


def _report_crash(task: asyncio.Task) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.critical("the batching loop stopped; queued calls will not be served",
                     exc_info=task.exception())
