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

Priority classes (docs/priority.md): while interactive traffic is recent, a
step of batch work alone is not formed while another step is in the engine
(it would wait there, and the next interactive call behind both); it is formed
when the engine is free, or at once with the interactive call that arrives.
Which sequences a step holds is ``policy.plan_priority_batch``'s.

Where the engine preempts steps (the CPU engine: ``engine.preempts_steps``) and
``preempt`` is on, the loop runs two lanes instead (``_run_lanes``): each class in
steps of its own, ``policy.plan_lane_steps``, up to ``in_flight_depth`` steps of each
in the engine. Batch steps run at the full budget on the engine's worker, never
inline, so the loop stays free to read the calls that arrive meanwhile; an
interactive step is submitted with ``preempt``: it runs at the next layer boundary
of the batch step being computed, which then resumes, so a query waits for one
layer of a batch step, not for the step (or for two). An interactive step with no
step in the engine runs inline as before.

When no step is in the engine and every call in the batch came over frames,
the step runs inline: the loop computes it itself (on CPU; runners/cpu.py says
why that is faster) and its rows go to their calls at once. Nothing was read
while it ran, so the loop then takes a few turns before forming the next batch:
the answers go out, and the calls (and cancels) that arrived meanwhile are read
and admitted, so they can join that batch rather than wait a step more. Frames
hand over all of them in one read; grpc.aio hands over about one call per turn,
so with inline steps a burst over gRPC would be stepped a call at a time: its
calls keep the worker thread.
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
from embedserve.engine.token_rows import call_rows, is_token_state_step
from embedserve.errors import DeviceLost
from embedserve.link.wire import BATCH, INTERACTIVE
from embedserve.model.info import ModelInfo
from embedserve.scheduler.metrics import SchedulerMetrics
from embedserve.scheduler.policy import BatchPlan
from embedserve.scheduler.pool import Call, RequestPool, SequenceEntry

log = logging.getLogger(__name__)

# Turns of the loop after an inline step before it looks at the queue: one reads
# the frames that arrived, the next runs the new calls' handlers up to admission
# (or their cancellation), one to spare. A turn with nothing to do costs microseconds.
TURNS_AFTER_INLINE_STEP = 3


class StepEngine(Protocol):
    """What the scheduler needs of an engine (``embedserve.engine.Engine`` has it)."""

    info: ModelInfo

    def step(self, batch: Batch, inline: bool = False) -> LazyTensor: ...

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
    """One packed Batch from the runs' token slices, in batch order. It returns token
    states too when any of its calls asks for them (each call then takes its half:
    engine/token_rows.call_rows)."""
    token_states = any(run.call.token_states for run in runs)
    keyed = any(run.call.key_lengths is not None for run in runs)
    if len(runs) == 1 and runs[0].first_index == 0 \
            and runs[0].count == runs[0].call.tokens.num_sequences:
        # one whole call: its arrays as they are
        return Batch.of(runs[0].call.tokens, task, token_states, runs[0].call.key_lengths)
    id_parts, type_parts, length_parts, key_parts = [], [], [], []
    any_types = any(run.call.tokens.token_type_ids is not None for run in runs)
    for run in runs:
        part = run.call.tokens.slice(run.first_index, run.first_index + run.count)
        id_parts.append(part.token_ids)
        length_parts.append(part.lengths)
        if any_types:
            type_parts.append(part.token_type_ids if part.token_type_ids is not None
                              else np.zeros(part.num_tokens, dtype=np.int32))
        if keyed:   # a sequence with no key limit attends to all of itself
            keys = run.call.key_lengths
            key_parts.append(part.lengths.astype(np.int32) if keys is None
                             else keys[run.first_index:run.first_index + run.count])
    return Batch.from_lengths(np.concatenate(id_parts), np.concatenate(length_parts), task,
                              np.concatenate(type_parts) if any_types else None, token_states,
                              np.concatenate(key_parts) if keyed else None)


class Batcher:
    """Forms, submits and finishes engine steps between ``start()`` and ``stop()``."""

    def __init__(self, engine: StepEngine, pool: RequestPool, task: Task, token_budget: int,
                 max_sequences: int, in_flight_depth: int, metrics: SchedulerMetrics,
                 clock: Callable[[], float] = time.monotonic,
                 on_device_lost: Callable[[DeviceLost], None] | None = None,
                 preempt: bool = True) -> None:
        self._engine = engine
        # Lanes (module docstring) where asked for and the engine can preempt its steps.
        self._lanes = preempt and bool(getattr(engine, "preempts_steps", False))
        self._depth = in_flight_depth
        self._lane_steps = {INTERACTIVE: 0, BATCH: 0}   # each lane's steps in the engine
        self._pool = pool
        self._task = task
        self._token_budget = token_budget
        self._max_sequences = max_sequences
        self._slots = asyncio.Semaphore(in_flight_depth)
        self._metrics = metrics
        self._clock = clock
        self._on_device_lost = on_device_lost
        self._in_flight: set[LazyTensor] = set()
        # When the engine finished its last step (monotonic), per lane (None: one lane):
        # steps of a lane run one after another, those of two lanes inside each other.
        self._free_at: dict[str | None, float] = {None: 0.0, INTERACTIVE: 0.0, BATCH: 0.0}
        self._step_finished = asyncio.Event()   # set as each step finishes
        self._run_task: asyncio.Task | None = None

    @property
    def preempts(self) -> bool:
        """Whether interactive steps preempt batch steps (the two-lane loop runs)."""
        return self._lanes

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
        self._run_task = asyncio.create_task(self._run_lanes() if self._lanes else self._run(),
                                             name="embedserve-batcher")
        self._run_task.add_done_callback(_report_crash)

    async def _run(self) -> None:
        while True:
            await self._slots.acquire()
            try:
                runs = await self._next_runs()
            except BaseException:
                self._slots.release()
                raise
            if self._submit(runs):
                await self._let_arrivals_in()

    async def _run_lanes(self) -> None:
        while True:
            self._pool.interactive_arrived.clear()
            self._pool.batch_arrived.clear()
            self._step_finished.clear()
            plan = self._pool.take_lanes(self._token_budget, self._max_sequences,
                                         self._lane_steps[INTERACTIVE] < self._depth,
                                         self._lane_steps[BATCH] < self._depth)
            inline = False
            for priority, part in ((INTERACTIVE, plan.interactive), (BATCH, plan.batch)):
                self._observe_plan(part.dropped, part.taken, part.tokens, {priority: part})
                if part.taken:
                    self._lane_steps[priority] += 1
                    inline |= self._submit(group_runs(part.taken), lane=priority)
            if inline:
                await self._let_arrivals_in()
            elif not plan.interactive.taken and not plan.batch.taken:
                await self._work_or_room()

    async def _work_or_room(self) -> None:
        """Until a step finishes or a call arrives that a lane with room can take (the
        loop cleared the three events before it last planned)."""
        events = [self._step_finished]
        if self._lane_steps[INTERACTIVE] < self._depth:
            events.append(self._pool.interactive_arrived)
        if self._lane_steps[BATCH] < self._depth:
            events.append(self._pool.batch_arrived)
        await _first_of(events)

    async def _let_arrivals_in(self) -> None:
        """After an inline step: turns of the loop for what arrived meanwhile."""
        for _ in range(TURNS_AFTER_INLINE_STEP):
            await asyncio.sleep(0)

    async def _next_runs(self) -> list[Run]:
        while True:
            await self._pool.wait_for_work()
            if self._in_flight and self._pool.holds_only_batch_work() and \
                    self._pool.interactive_recent(self._clock()):
                # A batch step submitted now would wait in the engine behind the running
                # one, and the next interactive call behind both: form it once the
                # engine is free, or at once with the interactive call that arrives.
                await self._engine_free_or_interactive()
                continue
            plan = self._pool.take(self._token_budget, self._max_sequences)
            self._observe_plan(plan.dropped, plan.taken, plan.tokens,
                               {INTERACTIVE: plan.interactive, BATCH: plan.batch})
            if plan.taken:
                return group_runs(plan.taken)

    def _observe_plan(self, dropped: list[tuple[SequenceEntry, str]], taken: list[SequenceEntry],
                      tokens: int, parts: Mapping[str, BatchPlan[SequenceEntry]]) -> None:
        for _entry, reason in dropped:
            self._metrics.sequences_dropped.labels(reason).inc()
        if taken:
            self._metrics.batch_sequences.observe(len(taken))
            self._metrics.batch_tokens.observe(tokens)
            for priority, part in parts.items():
                if part.taken:
                    self._metrics.class_step_tokens.labels(priority).observe(part.tokens)

    async def _engine_free_or_interactive(self) -> None:
        self._pool.interactive_arrived.clear()
        self._step_finished.clear()
        await _first_of([self._step_finished, self._pool.interactive_arrived])

    def _submit(self, runs: list[Run], lane: str | None = None) -> bool:
        """Step ``runs``; True if the step had finished when the engine returned it.

        ``lane``: the class of a two-lane step (``_run_lanes``), else None."""
        now = self._clock()
        for run in runs:
            if run.call.first_batched_at is None:
                run.call.first_batched_at = now
                self._metrics.queue_seconds.observe(now - run.call.arrival)
                self._metrics.class_queue_seconds.labels(run.call.priority).observe(
                    now - run.call.arrival)
        inline = not self._in_flight and lane != BATCH and all(run.call.read_in_bulk for run in runs)
        batch = assemble_batch(runs, self._task)
        try:
            if lane == INTERACTIVE and not inline:
                # Between two layers of the batch step in the engine, or on its own.
                # (an engine with preempts_steps takes it; StepEngine's fakes need not)
                lazy = self._engine.step(batch, preempt=True)  # type: ignore[call-arg]
            else:
                lazy = self._engine.step(batch, inline=inline)
        except Exception as error:  # a step that cannot even start fails like one that ran
            self._fail(runs, error)
            self._release(lane)
            return False
        self._in_flight.add(lazy)
        if lazy.ready():
            self._step_done(lazy, runs, now, lane)
            return True
        lazy.on_ready(lambda done: self._step_done(done, runs, now, lane))
        return False

    def _release(self, lane: str | None) -> None:
        if lane is None:
            self._slots.release()
        else:
            self._lane_steps[lane] -= 1

    def _step_done(self, lazy: LazyTensor, runs: list[Run], submitted_at: float,
                   lane: str | None = None) -> None:
        if lazy not in self._in_flight:
            return   # stopped meanwhile
        self._in_flight.discard(lazy)
        try:
            self._finish(lazy, runs, submitted_at, lane)
        finally:
            self._release(lane)
            self._step_finished.set()

    def _finish(self, lazy: LazyTensor, runs: list[Run], submitted_at: float,
                lane: str | None = None) -> None:
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
        # A lane's steps run one after another in the engine: this one's own compute
        # began when it was submitted or when the lane's previous one finished (a batch
        # step's time includes the interactive steps run inside it).
        compute_s = finished_at - max(submitted_at, self._free_at[lane])
        self._free_at[lane] = finished_at
        # The part of it between the engine finishing and this callback running.
        wake_s = 0.0 if lazy.ready_at is None else min(compute_s, max(0.0, time.monotonic() - lazy.ready_at))
        self._metrics.step_seconds.observe(compute_s)
        step_tokens = -1
        token_states = is_token_state_step(rows)
        for run in runs:
            if run.call.steps is not None:   # a traced call (docs/tracing.md)
                if step_tokens < 0:
                    step_tokens = sum(int(r.call.tokens.lengths[r.first_index:r.first_index + r.count].sum())
                                      for r in runs)
                run.call.steps.append((finished_at - compute_s, finished_at, expected, step_tokens,
                                       len(runs), run.count))
            part = rows[run.row:run.row + run.count]
            if token_states:   # each call takes the half it asked for
                part = call_rows(part, run.call.token_states)
            run.call.deliver(run.first_index, part, compute_s, wake_s)

    def _fail(self, runs: list[Run], error: Exception) -> None:
        log.error("engine step of %d calls failed", len(runs), exc_info=error)
        self._metrics.steps_failed.inc()
        for run in runs:
            run.call.fail(error)
        if isinstance(error, DeviceLost) and self._on_device_lost is not None:
            self._on_device_lost(error)


async def _first_of(events: list[asyncio.Event]) -> None:
    """Return once one of ``events`` is set."""
    waits = [asyncio.ensure_future(event.wait()) for event in events]
    try:
        await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for wait in waits:
            wait.cancel()


def _report_crash(task: asyncio.Task) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.critical("the batching loop stopped; queued calls will not be served",
                     exc_info=task.exception())
