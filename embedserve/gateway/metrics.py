"""Prometheus metrics of one gateway app, in a registry of its own.

Owns the metric objects; a per-app ``CollectorRegistry`` (not the global
one) so several apps in one process (tests) do not collide. Metrics about
work and replicas carry a ``model`` label (the served model's canonical
name); request counts and latency are per route, as the HTTP layer counts
them before a model is chosen (and for requests that name none).
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest


class GatewayMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter("embedserve_gateway_requests",
                                "Requests by route (an HTTP path or a gRPC method) and status "
                                "(an HTTP status or a gRPC code name)",
                                ["route", "status"], registry=r)
        self.latency = Histogram("embedserve_gateway_request_seconds",
                                 "Request latency by route (an HTTP path or a gRPC method)",
                                 ["route"], registry=r,
                                 buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
                                          1, 2.5, 5, 10, 30, 60))
        # Per priority class (docs/priority.md), label ``priority``: requests to the
        # model routes, whatever their status.
        self.class_latency = Histogram("embedserve_gateway_class_request_seconds",
                                       "HTTP request latency of the model routes by priority class",
                                       ["priority"], registry=r,
                                       buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,
                                                0.25, 0.5, 1, 2.5, 5, 10, 30, 60))
        self.class_queue = Histogram("embedserve_gateway_class_queue_seconds",
                                     "Per request, by priority class: its longest wait for a "
                                     "replica plus that replica's queue time",
                                     ["priority"], registry=r,
                                     buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05,
                                              0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30))
        self.class_inflight_tokens = Gauge("embedserve_gateway_class_inflight_tokens",
                                           "Tokens admitted and not yet answered, by priority "
                                           "class", ["model", "priority"], registry=r)
        self.inputs = Counter("embedserve_gateway_inputs", "Inputs (texts or pairs) served",
                              ["route", "model"], registry=r)
        self.tokens = Counter("embedserve_gateway_tokens", "Tokens sent to replicas",
                              ["route", "model"], registry=r)
        self.inflight_tokens = Gauge("embedserve_gateway_inflight_tokens",
                                     "Tokens admitted and not yet answered", ["model"],
                                     registry=r)
        self.chunk_retries = Counter("embedserve_gateway_chunk_retries",
                                     "Chunks resent to another replica after a failure",
                                     ["model"], registry=r)
        self.replicas_healthy = Gauge("embedserve_gateway_replicas_healthy",
                                      "Replicas whose health watch says SERVING",
                                      ["model"], registry=r)
        self.replicas_known = Gauge("embedserve_gateway_replicas", "Replicas configured", ["model"],
                                    registry=r)
        # A kernel's first call for an argument signature (a compile, or a load from the
        # disk cache) by whether it happened in a warm-up or in a request: a tokenizer
        # serves only once warmed up, so "serving" stays 0 unless a request waited for one.
        self.kernel_first_calls = Counter("embedserve_gateway_tokenizer_kernel_first_calls",
                                          "Tokenizer kernel signatures compiled or loaded, by when",
                                          ["when"], registry=r)
        for when in ("warm_up", "serving"):
            self.kernel_first_calls.labels(when)
        # An info-style gauge (always 1): join on ``model`` to break any series down by task.
        self.model_task = Gauge("embedserve_gateway_model_task",
                                "The task of each served model (embed, score, classify, sparse)",
                                ["model", "task"], registry=r)
        # The children of the per-request label sets, each looked up once: ``labels()``
        # validates and locks on every call. Routes, statuses and models are few.
        self._request_children: dict[tuple[str, int | str], tuple] = {}
        self._work_children: dict[tuple[str, str], tuple] = {}

    def count_request(self, route: str, status: int | str, seconds: float) -> None:
        """One request answered with ``status`` (HTTP: a number; gRPC: a code name such as
        ``INVALID_ARGUMENT``) after ``seconds``."""
        children = self._request_children.get((route, status))
        if children is None:
            children = self._request_children[route, status] = (
                self.requests.labels(route, str(status)), self.latency.labels(route))
        children[0].inc()
        children[1].observe(seconds)

    def count_class_request(self, priority: str, seconds: float) -> None:
        """One request to a model route that ran in class ``priority``."""
        self.class_latency.labels(priority).observe(seconds)

    def count_work(self, route: str, model: str, inputs: int, tokens: int) -> None:
        """``inputs`` inputs of ``tokens`` tokens in all served for ``model`` on ``route``."""
        children = self._work_children.get((route, model))
        if children is None:
            children = self._work_children[route, model] = (
                self.inputs.labels(route, model), self.tokens.labels(route, model))
        children[0].inc(inputs)
        children[1].inc(tokens)

    def count_kernel_first_call(self, call: dict) -> None:
        """A tokenizer kernel's first call (kernel_cache.FirstCall), from any thread."""
        self.kernel_first_calls.labels("warm_up" if call["warm_up"] else "serving").inc()

    def render(self) -> bytes:
        return generate_latest(self.registry)
