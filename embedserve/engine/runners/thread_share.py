"""How many OpenMP threads each CPU step runs on while steps run side by side.

Owns the count of threads computing a step and each one's share of the cores. A CPU
runner with more than one lane (``runners/cpu.py``) computes up to that many steps at
once, each on its own thread: a step alone gets every core, as one step did before;
two steps get half the cores each. Why: one step on every core leaves cores idle
whenever its thread runs serial code (Python between operators, the operators too
small to split), and a core another process takes stalls the whole team at its next
barrier; two steps of half the team each fill each other's gaps (a bulk job through
``serve`` on 2 cores: docs/priority.md, BENCHMARKS.md).

Each computing thread fits its own team at the start of its step and again before
each transformer layer (a forward pre-hook), so a step that began alone gives up half
its cores a layer after a second one starts, and takes them back a layer after that
one ends. OpenMP's thread count (``torch.set_num_threads``: ``omp_set_num_threads``)
is per thread, so one thread's share leaves the other's alone; a step computes the
same numbers on one thread as on two (tests/test_engine_lanes.py checks it bit for
bit). torch also keeps the last count set as the one threads it has not seen yet start
with, so when the last computing thread ends its step the share puts ``threads`` back
there, and a thread torch has not seen yet does not start on a half share (a replica's
CPU a short query went from ~21 to ~10 ms with it: BENCHMARKS.md). Knows nothing about
batching or the model's math.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

import torch
from torch import nn


def transformer_layers(model: nn.Module) -> list[nn.Module]:
    """Every layer of ``model``'s ``layers`` lists (every family names its stack of
    transformer layers so), in order."""
    return [layer for name, module in model.named_modules()
            if isinstance(module, nn.ModuleList) and name.split(".")[-1] == "layers"
            for layer in module]


class ThreadShare:
    """The cores' split between the threads computing steps: ``threads`` in all."""

    def __init__(self, threads: int) -> None:
        self.threads = max(1, threads)
        self._computing = 0
        self._last_set = self.threads   # the count torch gives threads it has not seen yet
        self._lock = threading.Lock()
        self._local = threading.local()   # depth: a step run inside another adds no thread

    @property
    def computing(self) -> int:
        """Threads computing a step now."""
        return self._computing

    @contextlib.contextmanager
    def step(self) -> Iterator[None]:
        """Around a step on this thread: counts the thread in while it computes (a step
        inside another, an urgent one at a layer boundary, counts once) and fits its team."""
        depth = getattr(self._local, "depth", 0)
        if depth == 0:
            with self._lock:
                self._computing += 1
        self._local.depth = depth + 1
        try:
            self.fit()
            yield
        finally:
            self._local.depth = depth
            if depth == 0:
                with self._lock:
                    self._computing -= 1
                    if self._computing == 0 and self._last_set != self.threads:
                        torch.set_num_threads(self.threads)
                        self._last_set = self.threads

    def share(self) -> int:
        """A computing thread's share of the cores now."""
        return max(1, self.threads // max(1, self._computing))

    def fit(self) -> None:
        """Set this thread's OpenMP team to its share (a no-op when it has it)."""
        share = self.share()
        if torch.get_num_threads() != share:
            torch.set_num_threads(share)
            self._last_set = share

    @contextlib.contextmanager
    def fixed(self, threads: int) -> Iterator[None]:
        """This thread's team at ``threads`` inside (a replica's small steps: runners/cpu.py),
        at its share again after."""
        torch.set_num_threads(threads)
        self._last_set = threads
        try:
            yield
        finally:
            self.fit()

    def install(self, model: nn.Module) -> int:
        """Refit before every transformer layer of ``model``; returns the layers hooked."""
        layers = transformer_layers(model)
        for layer in layers:
            layer.register_forward_pre_hook(lambda _module, _args: self.fit())
        return len(layers)
