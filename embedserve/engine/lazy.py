"""LazyTensor: the handle ``Engine.step`` returns before the result exists.

Owns waiting and nothing else. Two producers fill one: a CPU worker thread
(wrapping a ``concurrent.futures.Future``) and, on CUDA, an async
device-to-host copy into a pinned buffer marked complete by a CUDA event.
Either way the caller may poll ``ready()``, block in ``wait()``, or
``await`` it without blocking the event loop.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import time
from collections.abc import Callable, Generator
from typing import Any

import numpy as np


class LazyTensor:
    """Base interface. ``wait()`` returns a NumPy array ([B, dim] or [B]).

    ``ready_at``: the ``time.monotonic()`` at which the producer finished, where
    it says (the CPU worker does), so a waiter can tell its own wake-up latency
    apart from the compute; None where unknown.
    """

    ready_at: float | None = None

    def ready(self) -> bool:
        raise NotImplementedError

    def wait(self, timeout: float | None = None) -> np.ndarray:
        raise NotImplementedError

    async def _await(self) -> np.ndarray:
        raise NotImplementedError

    def __await__(self) -> Generator[Any, None, np.ndarray]:
        return self._await().__await__()


class FutureLazyTensor(LazyTensor):
    """A result computed on a worker thread (the CPU path)."""

    def __init__(self, future: "concurrent.futures.Future[np.ndarray]") -> None:
        self._future = future
        # Runs on the worker thread the moment it sets the result.
        future.add_done_callback(self._mark_ready)

    def _mark_ready(self, _future: concurrent.futures.Future) -> None:
        self.ready_at = time.monotonic()

    def ready(self) -> bool:
        return self._future.done()

    def wait(self, timeout: float | None = None) -> np.ndarray:
        return self._future.result(timeout)

    async def _await(self) -> np.ndarray:
        return await asyncio.wrap_future(self._future)


class EventLazyTensor(LazyTensor):
    """A result landing in a pinned host buffer, complete when ``event`` fires.

    ``finish`` turns the host buffer into the value (slicing off padding,
    copying out of a buffer that a later replay will overwrite). It runs once.
    """

    def __init__(self, event: Any, finish: Callable[[], np.ndarray]) -> None:
        self._event = event
        self._finish = finish
        self._value: np.ndarray | None = None

    def ready(self) -> bool:
        return self._value is not None or bool(self._event.query())

    def wait(self, timeout: float | None = None) -> np.ndarray:
        if self._value is None:
            # cudaEventSynchronize has no timeout; the event always fires once
            # the stream reaches it, so a timeout is not needed here.
            self._event.synchronize()
            self._value = self._finish()
        return self._value

    async def _await(self) -> np.ndarray:
        if self._value is not None:
            return self._value
        # Event.synchronize releases the GIL; run it off the event loop.
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(None, self.wait)
