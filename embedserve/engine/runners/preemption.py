"""Preemption of a CPU step between its layers: an urgent step runs inside a long one.

Owns the urgent steps that wait for a layer boundary and the hooks that run them.
A step submitted as urgent (an interactive query, docs/priority.md) does not wait
for the step the engine is computing: before each of that step's transformer layers
(a forward pre-hook on every module of the model's ``layers`` lists), the thread
computing it runs the oldest urgent step to completion, resolves its future, and goes
on with the next layer. The running step's activations stay where they were (the
hook is a call on its stack), so it resumes where it left off and computes exactly
what it would have alone. An urgent step that finds no layer boundary ahead (the
step was pooling, or the engine was idle) runs before the next step starts, or as
a job of its own (``run_pending``, called by the runner).

Two rules bound what preemption can cost:

- at most one urgent step per layer boundary, so a long step always advances by a
  layer between two urgent steps, however fast they come (it cannot starve);
- an urgent step is never preempted itself (its own layers' hooks do nothing).

Steps may run on more than one thread at once (a runner's lanes, ``thread_share.py``):
the oldest urgent step goes to whichever thread reaches a layer boundary first (deque's
popleft is atomic, so each runs once), and "inside an urgent step" is each thread's
own. Knows nothing about batching, the model's math or the event loop: the runner hands
in the function that computes a step.
"""

from __future__ import annotations

import concurrent.futures
import threading
from collections import deque
from collections.abc import Callable

import numpy as np
from torch import nn

from embedserve.engine.batch import Batch
from embedserve.engine.runners.thread_share import transformer_layers

StepFunction = Callable[[Batch], np.ndarray]


class LayerPreemption:
    """Urgent steps, each run at the next layer boundary of the step being computed."""

    def __init__(self, run: StepFunction) -> None:
        self._run = run
        self._urgent: deque[tuple[Batch, concurrent.futures.Future[np.ndarray]]] = deque()
        self._local = threading.local()   # in_urgent_step: this thread is computing one
        self._count_lock = threading.Lock()
        self.preempted = 0   # urgent steps run at a layer boundary of another step

    def install(self, model: nn.Module) -> int:
        """Hook every layer of ``model``'s ``layers`` lists (every family names its stack
        of transformer layers so); returns the number of layers hooked."""
        layers = transformer_layers(model)
        for layer in layers:
            layer.register_forward_pre_hook(self._before_layer)
        return len(layers)

    def push(self, batch: Batch) -> concurrent.futures.Future[np.ndarray]:
        """Queue ``batch`` as urgent; its future resolves once it has run (anywhere)."""
        future: concurrent.futures.Future[np.ndarray] = concurrent.futures.Future()
        self._urgent.append((batch, future))
        return future

    def run_pending(self, count: Callable[[], None] | None = None) -> int:
        """Run every queued urgent step (before a step starts, or as a job of its own);
        returns how many ran. ``count``: called for each one before its answer is
        published (so whoever has the answer also sees it counted)."""
        ran = 0
        while self._run_one(count):
            ran += 1
        return ran

    def cancel_pending(self) -> None:
        """Cancel the urgent steps not run yet (the runner is closing)."""
        while self._urgent:
            self._urgent.popleft()[1].cancel()

    def _before_layer(self, _module: nn.Module, _args: tuple) -> None:
        if not getattr(self._local, "in_urgent_step", False):
            self._run_one(self._count_preempted)

    def _count_preempted(self) -> None:
        with self._count_lock:
            self.preempted += 1

    def _run_one(self, count: Callable[[], None] | None = None) -> bool:
        """Run the oldest queued urgent step, calling ``count`` before its answer is
        published (a client that has the answer then reads the step counted); False if
        none was queued."""
        try:
            batch, future = self._urgent.popleft()
        except IndexError:
            return False
        self._local.in_urgent_step = True
        outcome: np.ndarray | Exception
        try:
            outcome = self._run(batch)
        except Exception as error:  # the urgent step's failure, never the preempted step's
            outcome = error
        finally:
            self._local.in_urgent_step = False
        if count is not None:
            count()
        if isinstance(outcome, Exception):
            future.set_exception(outcome)
        else:
            future.set_result(outcome)
        return True
