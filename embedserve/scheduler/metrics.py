"""Prometheus metrics of one scheduler replica, in a registry of its own.

Owns the metric definitions and the HTTP endpoint that exposes them; the
batcher and the service only call ``observe``/``inc``. The gauges of live
state (queue, active calls, batches in flight) are read from their owners at
scrape time (``track_state``), not set on every change: a short call would
otherwise pay for eight gauge writes nobody reads. A per-server
``CollectorRegistry`` (not the process-global one) lets tests run several
servers in one process. The engine's own counters (graph captures and
replays, eager runs, padding waste, ...) are read from ``engine.stats()`` at
scrape time and exported as ``embedserve_engine_<name>`` gauges.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

_TOKEN_BUCKETS = (16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192)
_SEQUENCE_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)
_SECONDS_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0,
                    2.5, 5.0, 10.0)


class SchedulerMetrics:
    """The scheduler's metrics; ``registry`` is what the endpoint serves."""

    def __init__(self, engine_stats: Callable[[], Mapping[str, Any]] | None = None) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.queue_sequences = Gauge("embedserve_scheduler_queue_sequences",
                                     "Sequences waiting for a batch", registry=r)
        self.queue_tokens = Gauge("embedserve_scheduler_queue_tokens",
                                  "Tokens waiting for a batch (bounded by max_queue_tokens)",
                                  registry=r)
        self.active_calls = Gauge("embedserve_scheduler_active_calls",
                                  "Embed/Score calls admitted and not yet answered", registry=r)
        self.in_flight_batches = Gauge("embedserve_scheduler_in_flight_batches",
                                       "Batches submitted to the engine and not yet finished",
                                       registry=r)
        self.batch_sequences = Histogram("embedserve_scheduler_batch_sequences",
                                         "Sequences per engine step", buckets=_SEQUENCE_BUCKETS,
                                         registry=r)
        self.batch_tokens = Histogram("embedserve_scheduler_batch_tokens",
                                      "Tokens per engine step", buckets=_TOKEN_BUCKETS,
                                      registry=r)
        self.step_seconds = Histogram("embedserve_scheduler_step_seconds",
                                      "Engine time per step (submit or engine free, to result)",
                                      buckets=_SECONDS_BUCKETS, registry=r)
        self.queue_seconds = Histogram("embedserve_scheduler_queue_seconds",
                                       "Per call: arrival until its first sequence is batched",
                                       buckets=_SECONDS_BUCKETS, registry=r)
        # The priority classes (docs/priority.md), label ``priority``: interactive or batch.
        self.class_queue_seconds = Histogram(
            "embedserve_scheduler_class_queue_seconds",
            "Per call, by priority class: arrival until its first sequence is batched",
            ["priority"], buckets=_SECONDS_BUCKETS, registry=r)
        self.class_call_seconds = Histogram(
            "embedserve_scheduler_class_call_seconds",
            "Per answered call, by priority class: arrival until its rows are ready",
            ["priority"], buckets=_SECONDS_BUCKETS, registry=r)
        self.class_step_tokens = Histogram(
            "embedserve_scheduler_class_step_tokens",
            "Tokens of each priority class per engine step that carried that class",
            ["priority"], buckets=_TOKEN_BUCKETS, registry=r)
        self.class_queue_tokens = Gauge("embedserve_scheduler_class_queue_tokens",
                                        "Tokens waiting for a batch, by priority class "
                                        "(each bounded by max_queue_tokens)",
                                        ["priority"], registry=r)
        self.calls = Counter("embedserve_scheduler_calls",
                             "Finished calls by method and gRPC status code",
                             ["method", "code"], registry=r)
        self.calls_dropped = Counter("embedserve_scheduler_calls_dropped",
                                     "Calls given up before their answer, by reason",
                                     ["reason"], registry=r)
        self.sequences_dropped = Counter("embedserve_scheduler_sequences_dropped",
                                         "Queued sequences removed unrun, by reason",
                                         ["reason"], registry=r)
        self.steps_failed = Counter("embedserve_scheduler_steps_failed",
                                    "Engine steps that raised", registry=r)
        if engine_stats is not None:
            self.registry.register(_EngineStatsCollector(engine_stats))
        # Each (method, code)'s child looked up once: ``labels()`` validates and locks.
        self._call_children: dict[tuple[str, str], Any] = {}

    def count_call(self, method: str, code: str) -> None:
        """One finished Embed/Score/Ranges call and its gRPC status code's name."""
        child = self._call_children.get((method, code))
        if child is None:
            child = self._call_children[method, code] = self.calls.labels(method, code)
        child.inc()

    def observe_call(self, priority: str, seconds: float) -> None:
        """One answered Embed/Score call of class ``priority``, ``seconds`` after it arrived."""
        self.class_call_seconds.labels(priority).observe(seconds)

    def track_class_queues(self, queued_tokens_of: Callable[[str], float],
                           priorities: tuple[str, ...]) -> None:
        """Read each class's queued tokens from ``queued_tokens_of(priority)`` at each scrape."""
        for priority in priorities:
            self.class_queue_tokens.labels(priority).set_function(
                lambda p=priority: queued_tokens_of(p))  # type: ignore[misc]  # a bound default

    def track_state(self, queued_sequences: Callable[[], float], queued_tokens: Callable[[], float],
                    active_calls: Callable[[], float], in_flight_batches: Callable[[], float]) -> None:
        """Read the state gauges from these functions at each scrape."""
        self.queue_sequences.set_function(queued_sequences)
        self.queue_tokens.set_function(queued_tokens)
        self.active_calls.set_function(active_calls)
        self.in_flight_batches.set_function(in_flight_batches)


class _EngineStatsCollector(Collector):
    """Exports each numeric entry of ``engine.stats()`` as a gauge at scrape time."""

    def __init__(self, engine_stats: Callable[[], Mapping[str, Any]]) -> None:
        self._engine_stats = engine_stats

    def describe(self) -> list:
        return []  # names depend on the engine; skip registry-time collision checks

    def collect(self) -> Iterator[GaugeMetricFamily]:
        for name, value in sorted(self._engine_stats().items()):
            if isinstance(value, (bool, int, float)):
                yield GaugeMetricFamily(f"embedserve_engine_{_metric_name(name)}",
                                        f"engine.stats()['{name}']", value=float(value))


def _metric_name(name: str) -> str:
    return "".join(c if c.isalnum() else "_" for c in name).strip("_").lower()


class MetricsEndpoint:
    """The /metrics HTTP server on its own port (a daemon thread)."""

    def __init__(self, registry: CollectorRegistry, host: str, port: int) -> None:
        self._server, self._thread = start_http_server(port, addr=host, registry=registry)
        self.port: int = self._server.server_port

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)

