"""LazyTensor: the handle ``Engine.step`` returns before the result exists.

Owns waiting and nothing else. Both runners fill one through a
``concurrent.futures.Future``: the CPU worker thread, and on CUDA the
completion thread once the step's event has fired (runners/cuda.py). The
caller may poll ``ready()``, block in ``wait(timeout)``, ``await`` it
without blocking the event loop, or have the loop called back (``on_ready``).
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

    def on_ready(self, callback: Callable[[LazyTensor], None]) -> None:
        """Call ``callback(self)`` on the running event loop once the result or error is
        in (``wait()`` then answers at once). One hop from the producer's thread to the
        loop, where a task awaiting the handle takes a turn of the loop more."""
        raise NotImplementedError

    def __await__(self) -> Generator[Any, None, np.ndarray]:
        return self._await().__await__()


class FutureLazyTensor(LazyTensor):
    """A result computed on a worker thread (the CPU path)."""

    def __init__(self, future: concurrent.futures.Future[np.ndarray]) -> None:
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

    def on_ready(self, callback: Callable[[LazyTensor], None]) -> None:
        loop = asyncio.get_running_loop()

        def hand_over(_future: concurrent.futures.Future) -> None:
            try:
                loop.call_soon_threadsafe(callback, self)
            except RuntimeError:
                pass   # the loop has closed: nobody is left to tell

        self._future.add_done_callback(hand_over)
