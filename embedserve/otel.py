"""The OpenTelemetry spans of the gateway and the replicas (docs/tracing.md).

Imported only when tracing is on (``tracing.start_tracer``): a process that
does not trace never loads OpenTelemetry. Owns the SDK's set-up (resource,
sampler, OTLP/HTTP exporter), W3C trace-context parsing and writing, and the
two shapes of spans the tiers make:

- ``RequestTrace``: one HTTP request in the gateway. A SERVER span continuing
  the client's ``traceparent``, its phases (``parse``, ``tokenize``, ``queue``)
  as children recorded when they end, and one CLIENT ``dispatch`` span per
  replica call, whose context travels to the replica in the request message.
- ``CallTrace``: one call in a replica. A SERVER span continuing the gateway's
  ``dispatch``, and its ``queue`` and ``step`` children: one ``step`` span per
  engine step that carried rows of the call, with the step's size as
  attributes (a step serving several calls appears under each of them).

Times: the tiers measure with monotonic clocks; spans need wall-clock
nanoseconds, so each trace converts with one offset taken when it starts.
Knows nothing of HTTP frameworks, gRPC or the scheduler's types: callers hand it
plain values.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import SpanProcessor, TracerProvider, sampling
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.trace import Span, SpanKind, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
from opentelemetry.util.types import AttributeValue

import embedserve

_PROPAGATOR = TraceContextTextMapPropagator()
Attributes = Mapping[str, AttributeValue]

# One engine step as a call saw it: monotonic start and end seconds, the step's
# sequences and tokens, how many calls it served, and how many of its rows were this call's.
StepRecord = tuple[float, float, int, int, int, int]


def _sampler(name: str, ratio: float) -> sampling.Sampler:
    """OTEL_TRACES_SAMPLER's names (tracing.SAMPLERS) as SDK samplers."""
    root = {"always_on": sampling.ALWAYS_ON, "always_off": sampling.ALWAYS_OFF,
            "traceidratio": sampling.TraceIdRatioBased(ratio)}
    if name.startswith("parentbased_"):
        return sampling.ParentBased(root[name.removeprefix("parentbased_")])
    return root[name]


# A gRPC server span is an error for these codes only (OpenTelemetry's RPC conventions):
# the others are the client's doing.
_SERVER_FAULT_CODES = frozenset({"UNKNOWN", "DEADLINE_EXCEEDED", "UNIMPLEMENTED", "INTERNAL",
                                 "UNAVAILABLE", "DATA_LOSS"})


class Tracer:
    """A process's spans: made here, sent by the provider's span processors."""

    def __init__(self, provider: TracerProvider) -> None:
        self._provider = provider
        self.tracer = provider.get_tracer("embedserve", embedserve.__version__)

    @classmethod
    def exporting(cls, endpoint: str, service_name: str, sampler: str = "parentbased_always_on",
                  sampler_arg: float = 1.0, headers: Iterable[tuple[str, str]] = (),
                  resource_attributes: Iterable[tuple[str, str]] = ()) -> Tracer:
        """Spans batched and sent as OTLP/HTTP protobuf to ``endpoint`` (.../v1/traces), off
        the event loop (the batch processor's thread)."""
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        exporter = OTLPSpanExporter(endpoint=endpoint, headers=dict(headers))
        return cls.with_processor(BatchSpanProcessor(exporter), service_name, sampler, sampler_arg,
                                  resource_attributes)

    @classmethod
    def with_processor(cls, processor: SpanProcessor, service_name: str,
                       sampler: str = "parentbased_always_on", sampler_arg: float = 1.0,
                       resource_attributes: Iterable[tuple[str, str]] = ()) -> Tracer:
        """Spans handed to ``processor`` (tests: a SimpleSpanProcessor over an in-memory exporter)."""
        resource = Resource.create({**dict(resource_attributes), "service.name": service_name,
                                    "service.version": embedserve.__version__})
        provider = TracerProvider(resource=resource, sampler=_sampler(sampler, sampler_arg))
        provider.add_span_processor(processor)
        return cls(provider)

    def shutdown(self) -> None:
        """Send what is still batched, then stop (the entry point's last step)."""
        self._provider.shutdown()

    def request(self, method: str, path: str, traceparent: str | None, tracestate: str | None,
                attributes: Attributes, name: str | None = None) -> RequestTrace:
        """A gateway request: an HTTP one (span ``METHOD PATH``), or a public gRPC API call
        (``name``: ``service/method``, as gRPC names its spans)."""
        return RequestTrace(self.tracer, method, path, traceparent, tracestate, attributes, name)

    def call(self, method: str, traceparent: str, tracestate: str, arrival: float,
             attributes: Attributes) -> CallTrace:
        """A replica call that arrived at ``arrival`` (time.monotonic() seconds)."""
        return CallTrace(self.tracer, method, traceparent, tracestate, arrival, attributes)


def _continued(traceparent: str | None, tracestate: str | None) -> Context | None:
    """The remote parent a W3C ``traceparent`` names (None: absent or malformed, a new trace)."""
    if not traceparent:
        return None
    carrier = {"traceparent": traceparent}
    if tracestate:
        carrier["tracestate"] = tracestate
    return _PROPAGATOR.extract(carrier)


def context_headers(span: Span) -> tuple[str, str]:
    """(traceparent, tracestate) naming ``span`` as the parent of the callee's spans."""
    carrier: dict[str, str] = {}
    _PROPAGATOR.inject(carrier, context=trace.set_span_in_context(span))
    return carrier.get("traceparent", ""), carrier.get("tracestate", "")


class RequestTrace:
    """One gateway request: its SERVER span, phases and replica calls under it."""

    __slots__ = ("_tracer", "_method", "span", "start_ns", "_context")

    def __init__(self, tracer: trace.Tracer, method: str, path: str, traceparent: str | None,
                 tracestate: str | None, attributes: Attributes, name: str | None = None) -> None:
        self._tracer = tracer
        self._method = method
        self.start_ns = time.time_ns()
        self.span = tracer.start_span(name or f"{method} {path}", context=_continued(traceparent, tracestate),
                                      kind=SpanKind.SERVER, start_time=self.start_ns,
                                      attributes=attributes)
        self._context = trace.set_span_in_context(self.span)

    def phase(self, name: str, start_ns: int, end_ns: int | None = None,
              attributes: Attributes | None = None) -> None:
        """A child span of the request that has already ended (or ends now)."""
        span = self._tracer.start_span(name, context=self._context, start_time=start_ns,
                                       attributes=attributes)
        span.end(end_time=end_ns if end_ns is not None else time.time_ns())

    def set_attributes(self, attributes: Attributes) -> None:
        self.span.set_attributes(attributes)

    def dispatch(self, attributes: Attributes) -> Span:
        """A CLIENT span for one replica call, started now; ``context_headers`` names it
        to the replica, ``end_dispatch`` ends it."""
        return self._tracer.start_span("dispatch", context=self._context, kind=SpanKind.CLIENT,
                                       attributes=attributes)

    @staticmethod
    def context_headers(span: Span) -> tuple[str, str]:
        """(traceparent, tracestate) naming ``span`` as the parent of the replica's spans."""
        return context_headers(span)

    @staticmethod
    def end_dispatch(span: Span, code: str, reply_attributes: Attributes | None = None) -> None:
        """End a ``dispatch`` span with the call's status code name (OK, UNAVAILABLE, ...)."""
        span.set_attribute("rpc.grpc.status_code", code)
        if reply_attributes:
            span.set_attributes(reply_attributes)
        if code != "OK":
            span.set_status(Status(StatusCode.ERROR, code))
        span.end()

    def end(self, status: int, route: str | None) -> None:
        """End the request with its HTTP status (5xx marks the span as an error) and the
        route template it matched (the span's name becomes ``METHOD ROUTE``)."""
        if route is not None:
            self.span.set_attribute("http.route", route)
            self.span.update_name(f"{self._method} {route}")
        self.span.set_attribute("http.response.status_code", status)
        if status >= 500:
            self.span.set_status(Status(StatusCode.ERROR))
        self.span.end()

    def end_rpc(self, code: str) -> None:
        """End a public gRPC API call with its status code name; the codes OpenTelemetry
        counts as a server's fault mark the span as an error."""
        self.span.set_attribute("rpc.grpc.status_code", code)
        if code in _SERVER_FAULT_CODES:
            self.span.set_status(Status(StatusCode.ERROR, code))
        self.span.end()


class CallTrace:
    """One replica call: its SERVER span, continuing the gateway's ``dispatch`` span."""

    __slots__ = ("_tracer", "span", "_offset_ns")

    def __init__(self, tracer: trace.Tracer, method: str, traceparent: str, tracestate: str,
                 arrival: float, attributes: Attributes) -> None:
        self._tracer = tracer
        # time.monotonic() seconds + offset = wall-clock nanoseconds, for this call's spans.
        self._offset_ns = time.time_ns() - time.monotonic_ns()
        self.span = tracer.start_span(f"embedserve.v1.Inference/{method}",
                                      context=_continued(traceparent, tracestate),
                                      kind=SpanKind.SERVER,
                                      start_time=self._wall_ns(arrival),
                                      attributes=attributes)

    def _wall_ns(self, monotonic_s: float) -> int:
        return int(monotonic_s * 1e9) + self._offset_ns

    def end(self, arrival: float, first_batched_at: float | None, steps: Iterable[StepRecord],
            error: BaseException | None, attributes: Attributes | None = None) -> None:
        """Record the call's ``queue`` (arrival -> its first step) and ``step`` spans, then end
        it; ``error``: why it failed (None: answered)."""
        context = trace.set_span_in_context(self.span)
        if first_batched_at is not None:
            self._tracer.start_span("queue", context=context, start_time=self._wall_ns(arrival)).end(
                end_time=self._wall_ns(first_batched_at))
        for started, finished, sequences, tokens, calls, rows in steps:
            self._tracer.start_span("step", context=context, start_time=self._wall_ns(started),
                                    attributes={"embedserve.step.sequences": sequences,
                                                "embedserve.step.tokens": tokens,
                                                "embedserve.step.calls": calls,
                                                "embedserve.step.call_rows": rows}).end(
                end_time=self._wall_ns(finished))
        if attributes:
            self.span.set_attributes(attributes)
        if error is not None:
            self.span.set_status(Status(StatusCode.ERROR, f"{type(error).__name__}: {error}"))
        self.span.end(end_time=time.monotonic_ns() + self._offset_ns)
