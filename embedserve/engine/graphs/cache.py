"""The CUDA-graph cache policy: buckets, warm-up then capture then replay, eviction.

Owns deciding, for each step, whether to run eagerly, capture a graph or
replay one, and counting what happened. It never touches CUDA itself: a
``CaptureBackend`` does the work, so the policy is unit-tested on CPU with a
fake backend and the CUDA runner supplies the real one.

Policy:
- every step maps to a bucket (``shapes.py``); a step larger than the
  biggest graphable bucket always runs eagerly;
- the first time a bucket is seen it runs eagerly (warm-up: lazy kernel and
  allocator initialization must not be captured); the second time a graph is
  captured and replayed; afterwards it is replayed;
- at most ``max_graphs`` graphs are kept, and at most ``max_bytes`` of device
  memory between them (each graph's size is what its capture measured); the
  least recently replayed one is released first (an evicted bucket is
  recaptured on its next use);
- a bucket whose capture fails, or whose graph alone is larger than
  ``max_bytes``, is marked and runs eagerly from then on.

One thread drives a cache (the CUDA runner's engine thread); ``stats()`` may
be read from any thread.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Any, Protocol

from embedserve.engine.graphs.shapes import BucketKey, bucket_for


class CaptureBackend(Protocol):
    """What the cache needs from a device. ``inputs`` is opaque to the cache."""

    def run_eager(self, key: BucketKey, inputs: Any) -> Any: ...

    def capture(self, key: BucketKey, inputs: Any) -> Any:
        """Record a graph for ``key`` (its static buffers filled from ``inputs``)."""

    def replay(self, key: BucketKey, graph: Any, inputs: Any) -> Any: ...

    def release(self, key: BucketKey, graph: Any) -> None: ...

    def nbytes(self, graph: Any) -> int:
        """Device memory ``graph`` holds (measured at its capture)."""


class GraphCache:
    def __init__(self, backend: CaptureBackend, max_graphs: int = 64, max_tokens: int = 8192,
                 max_sequences: int = 256, clock: Callable[[], float] = time.perf_counter,
                 max_bytes: int | None = None) -> None:
        if max_graphs < 1:
            raise ValueError("max_graphs must be at least 1")
        if max_bytes is not None and max_bytes < 1:
            raise ValueError("max_bytes must be at least 1 (None: no limit)")
        self._backend = backend
        self._max_graphs = max_graphs
        self._max_bytes = max_bytes
        self._sizes: dict[BucketKey, int] = {}
        self._lock = threading.Lock()
        # max_tokens <= 0: nothing is graphable (eager only, e.g. to measure eager).
        self._max_key = bucket_for(max_tokens, max_sequences) if max_tokens > 0 else None
        self._clock = clock
        self._graphs: OrderedDict[BucketKey, Any] = OrderedDict()   # LRU order, oldest first
        self._seen: set[BucketKey] = set()
        self._uncapturable: set[BucketKey] = set()
        self.counters = {"eager_runs": 0, "captures": 0, "replays": 0, "evictions": 0,
                         "capture_failures": 0, "too_large": 0, "capture_time_s": 0.0,
                         "real_tokens": 0, "padded_tokens": 0}

    def graphable(self, key: BucketKey) -> bool:
        if self._max_key is None:
            return False
        return key.tokens <= self._max_key.tokens and key.sequences <= self._max_key.sequences

    def run(self, tokens: int, sequences: int, inputs: Any) -> Any:
        """Run one step of ``tokens`` real tokens in ``sequences`` sequences."""
        key = bucket_for(tokens, sequences)
        with self._lock:
            self.counters["real_tokens"] += tokens
            self.counters["padded_tokens"] += key.tokens
        graph = self._graphs.get(key)
        if graph is not None:
            self._graphs.move_to_end(key)
            self._count("replays")
            return self._backend.replay(key, graph, inputs)
        if key not in self._seen or key in self._uncapturable or not self.graphable(key):
            self._seen.add(key)
            self._count("eager_runs")
            return self._backend.run_eager(key, inputs)
        return self._capture_and_replay(key, inputs)

    def _count(self, name: str, amount: float = 1) -> None:
        with self._lock:
            self.counters[name] += amount

    def _capture_and_replay(self, key: BucketKey, inputs: Any) -> Any:
        started = self._clock()
        try:
            graph = self._backend.capture(key, inputs)
        except Exception:
            # A capture can fail (out of memory, an uncapturable op): serve eagerly.
            self._uncapturable.add(key)
            self._count("capture_failures")
            self._count("eager_runs")
            return self._backend.run_eager(key, inputs)
        finally:
            self._count("capture_time_s", self._clock() - started)
        self._count("captures")
        size = self._backend.nbytes(graph)
        if self._max_bytes is not None and size > self._max_bytes:
            self._backend.release(key, graph)
            self._uncapturable.add(key)
            self._count("too_large")
            self._count("eager_runs")
            return self._backend.run_eager(key, inputs)
        self._graphs[key] = graph
        self._sizes[key] = size
        while len(self._graphs) > self._max_graphs or self._over_bytes():
            self._evict_oldest()
        self._count("replays")
        return self._backend.replay(key, graph, inputs)

    def _over_bytes(self) -> bool:
        return self._max_bytes is not None and sum(self._sizes.values()) > self._max_bytes

    def _evict_oldest(self) -> None:
        old_key, old_graph = self._graphs.popitem(last=False)
        del self._sizes[old_key]
        self._backend.release(old_key, old_graph)
        self._count("evictions")

    @property
    def max_graphs(self) -> int:
        return self._max_graphs

    @property
    def cached_keys(self) -> list[BucketKey]:
        """Buckets with a live graph, least recently used first."""
        return list(self._graphs)

    def stats(self) -> dict[str, float]:
        with self._lock:
            counters = dict(self.counters)
        padded, real = counters["padded_tokens"], counters["real_tokens"]
        return {**counters, "graphs": len(self._sizes), "graph_bytes": sum(self._sizes.values()),
                "padding_waste": (padded - real) / padded if padded else 0.0}

    def clear(self) -> None:
        for key, graph in self._graphs.items():
            self._backend.release(key, graph)
        self._graphs.clear()
        self._sizes.clear()
