"""OpenTelemetry tracing across the tiers (docs/tracing.md).

One request through a real gateway and a real replica (both in this process, so the
SDK's in-memory exporter sees both tiers' spans; the replica called as frames and as
gRPC) makes one trace: the client's ``traceparent`` continued, the gateway's phases
under its request span, the replica's call under the gateway's ``dispatch`` span and its
queue and engine step under that, with the attributes the page names, counted against
the Hugging Face tokenizer. A client's unsampled ``traceparent`` is obeyed by both tiers.
Then a real ``embedserve serve --otlp-endpoint`` exports its spans to an OTLP/HTTP
receiver started here (decoding the OTLP protobuf messages), and with tracing off a
gateway and replica serving a request never load the OpenTelemetry SDK.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import grpc
import httpx
import pytest
import tokenizers
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

from embedserve.entrypoint import StartupError
from embedserve.otel import Tracer
from embedserve.protos import embeddings_pb2, embeddings_pb2_grpc
from embedserve.scheduler.settings import SchedulerSettings
from embedserve.tracing import tracing_settings
from gateway_harness import GatewayServer, gateway_settings
from scheduler_harness import ThreadedScheduler, wait_until
from serve_harness import served_with_grpc

ROOT = Path(__file__).resolve().parent.parent
TEXTS = ["one short sentence", "and another, a little longer than the first one"]
GATEWAY_SERVICE = "embedserve-gateway"
REPLICA_SERVICE = "embedserve-replica"


@pytest.fixture(scope="module")
def exporter() -> InMemorySpanExporter:
    return InMemorySpanExporter()


@pytest.fixture(scope="module")
def replica(tiny_bert_dir: Path, bert_engine, exporter: InMemorySpanExporter) -> Iterator[ThreadedScheduler]:
    tracer = Tracer.with_processor(SimpleSpanProcessor(exporter), REPLICA_SERVICE)
    settings = SchedulerSettings(model_dir=tiny_bert_dir, max_batch_tokens=512, dtype="float32")
    with ThreadedScheduler(settings, bert_engine, tracer=tracer) as server:
        yield server


@pytest.fixture(scope="module", params=["frames", "grpc"])
def gateway(request, tiny_bert_dir: Path, replica: ThreadedScheduler,
            exporter: InMemorySpanExporter) -> Iterator[GatewayServer]:
    """A gateway calling the replica over ``frames`` (its TCP frame port) or ``grpc``."""
    tracer = Tracer.with_processor(SimpleSpanProcessor(exporter), GATEWAY_SERVICE)
    server = GatewayServer(gateway_settings(tiny_bert_dir, [f"127.0.0.1:{replica.port}"],
                                            replica_calls=request.param), tracer=tracer)
    try:
        server.wait_ready(healthy=1)
        wait_until(lambda: _transport(server) == request.param, what=f"calls over {request.param}")
        yield server
    finally:
        server.stop()


def _transport(server: GatewayServer) -> str:
    return httpx.get(server.url + "/info", timeout=10).json()["replicas"][0]["calls"]


def _traceparent() -> tuple[str, str, str]:
    trace_id, parent_id = secrets.token_hex(16), secrets.token_hex(8)
    return trace_id, parent_id, f"00-{trace_id}-{parent_id}-01"


def _spans_of(exporter: InMemorySpanExporter, trace_id: str, count: int) -> list[ReadableSpan]:
    """The trace's spans once ``count`` have ended (the request span ends after the reply)."""
    def trace_spans() -> list[ReadableSpan]:
        return [s for s in exporter.get_finished_spans()
                if format(s.context.trace_id, "032x") == trace_id]
    wait_until(lambda: len(trace_spans()) >= count, what=f"{count} spans of trace {trace_id}")
    return trace_spans()


def _one(spans: list[ReadableSpan], name: str, service: str) -> ReadableSpan:
    found = [s for s in spans if s.name == name and s.resource.attributes["service.name"] == service]
    assert len(found) == 1, [(s.name, s.resource.attributes["service.name"]) for s in spans]
    return found[0]


def test_one_request_is_one_trace_across_gateway_and_replica(gateway: GatewayServer, replica,
                                                             exporter, tiny_bert_dir: Path):
    trace_id, parent_id, traceparent = _traceparent()
    reply = httpx.post(gateway.url + "/v1/embeddings", json={"input": TEXTS},
                       headers={"traceparent": traceparent, "tracestate": "vendor=abc"}, timeout=60)
    assert reply.status_code == 200, reply.text
    # request, parse, tokenize, queue, dispatch; the replica's call, queue, step
    spans = _spans_of(exporter, trace_id, 8)
    assert len(spans) == 8, [s.name for s in spans]

    request = _one(spans, "POST /v1/embeddings", GATEWAY_SERVICE)
    assert request.kind is SpanKind.SERVER
    assert request.parent is not None and request.parent.is_remote
    assert format(request.parent.span_id, "016x") == parent_id      # the client's span continued
    assert request.context.trace_state.get("vendor") == "abc"
    # The reference: the tokenizers library over the model's tokenizer.json, specials included.
    reference = tokenizers.Tokenizer.from_file(str(tiny_bert_dir / "tokenizer.json"))
    tokens = sum(len(encoding.ids) for encoding in reference.encode_batch(TEXTS))
    assert request.attributes["http.route"] == "/v1/embeddings"
    assert request.attributes["http.response.status_code"] == 200
    assert request.attributes["embedserve.model"] == reply.json()["model"]
    assert request.attributes["embedserve.priority"] == "interactive"
    assert request.attributes["embedserve.sequences"] == len(TEXTS)
    assert request.attributes["embedserve.tokens"] == tokens
    assert request.attributes["embedserve.request_id"] == reply.headers["x-request-id"]

    for name in ("parse", "tokenize", "queue", "dispatch"):
        assert _one(spans, name, GATEWAY_SERVICE).parent.span_id == request.context.span_id, name
    dispatch = _one(spans, "dispatch", GATEWAY_SERVICE)
    assert dispatch.kind is SpanKind.CLIENT
    assert dispatch.attributes["server.address"] == f"127.0.0.1:{replica.port}"
    assert dispatch.attributes["embedserve.replica.transport"] == _transport(gateway)
    assert dispatch.attributes["rpc.method"] == "Embed"
    assert dispatch.attributes["rpc.grpc.status_code"] == "OK"
    assert dispatch.attributes["embedserve.tokens"] == tokens

    call = _one(spans, "embedserve.v1.Inference/Embed", REPLICA_SERVICE)
    assert call.kind is SpanKind.SERVER
    assert call.parent.span_id == dispatch.context.span_id          # across the process boundary
    assert call.context.trace_state.get("vendor") == "abc"
    assert call.attributes["rpc.system"] == ("embedserve.frames" if _transport(gateway) == "frames"
                                             else "grpc")
    assert call.attributes["embedserve.tokens"] == tokens
    assert call.attributes["embedserve.sequences"] == len(TEXTS)
    queue = _one(spans, "queue", REPLICA_SERVICE)
    step = _one(spans, "step", REPLICA_SERVICE)
    assert queue.parent.span_id == step.parent.span_id == call.context.span_id
    assert queue.start_time == call.start_time                       # both from the call's arrival
    assert step.attributes["embedserve.step.call_rows"] == len(TEXTS)
    assert step.attributes["embedserve.step.sequences"] >= len(TEXTS)
    assert step.attributes["embedserve.step.tokens"] >= tokens
    assert step.attributes["embedserve.step.calls"] >= 1


def test_a_request_without_traceparent_starts_a_trace_the_replica_joins(gateway, exporter):
    before = {s.context.span_id for s in exporter.get_finished_spans()}
    reply = httpx.post(gateway.url + "/v1/embeddings", json={"input": TEXTS[:1]}, timeout=60)
    assert reply.status_code == 200, reply.text

    def new_requests() -> list[ReadableSpan]:
        return [s for s in exporter.get_finished_spans() if s.context.span_id not in before
                and s.name == "POST /v1/embeddings"]
    wait_until(lambda: len(new_requests()) == 1, what="the request span")
    request = new_requests()[0]
    assert request.parent is None
    spans = _spans_of(exporter, format(request.context.trace_id, "032x"), 8)
    assert {s.resource.attributes["service.name"] for s in spans} == {GATEWAY_SERVICE, REPLICA_SERVICE}


def test_an_unsampled_traceparent_records_nothing_in_either_tier(gateway, exporter):
    trace_id, parent_id, _ = _traceparent()
    reply = httpx.post(gateway.url + "/v1/embeddings", json={"input": TEXTS},
                       headers={"traceparent": f"00-{trace_id}-{parent_id}-00"}, timeout=60)
    assert reply.status_code == 200, reply.text
    # A sampled request after it: once its spans are in, the unsampled one's would be too.
    marker, _, sampled = _traceparent()
    assert httpx.post(gateway.url + "/v1/embeddings", json={"input": TEXTS},
                      headers={"traceparent": sampled}, timeout=60).status_code == 200
    _spans_of(exporter, marker, 8)
    assert not [s for s in exporter.get_finished_spans()
                if format(s.context.trace_id, "032x") == trace_id]


class OtlpReceiver:
    """An OTLP/HTTP trace receiver on 127.0.0.1: POST /v1/traces, protobuf bodies decoded
    with the OTLP messages, every span kept with its service name."""

    def __init__(self) -> None:
        self.spans: list[tuple[str, object]] = []
        self.paths: set[str] = set()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["content-length"]))
                receiver.paths.add(self.path)
                message = trace_service_pb2.ExportTraceServiceRequest.FromString(body)
                for resource_spans in message.resource_spans:
                    service = next(a.value.string_value for a in resource_spans.resource.attributes
                                   if a.key == "service.name")
                    for scope_spans in resource_spans.scope_spans:
                        receiver.spans.extend((service, span) for span in scope_spans.spans)
                reply = trace_service_pb2.ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("content-type", "application/x-protobuf")
                self.send_header("content-length", str(len(reply)))
                self.end_headers()
                self.wfile.write(reply)

            def log_message(self, *args) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@contextlib.contextmanager
def otlp_receiver() -> Iterator[OtlpReceiver]:
    receiver = OtlpReceiver()
    try:
        yield receiver
    finally:
        receiver.close()


def test_serve_exports_both_tiers_spans_to_an_otlp_receiver(tiny_bert_dir: Path):
    trace_id, parent_id, traceparent = _traceparent()
    grpc_trace_id, grpc_parent_id, grpc_traceparent = _traceparent()
    with otlp_receiver() as receiver:
        # The SDK's batch processor holds spans for an hour here (OTEL_BSP_SCHEDULE_DELAY):
        # what arrives was sent by each process as it stopped.
        with served_with_grpc("--model", str(tiny_bert_dir), "--otlp-endpoint", receiver.url,
                              env={"OTEL_BSP_SCHEDULE_DELAY": "3600000"}) as (url, address):
            reply = httpx.post(url + "/v1/embeddings", json={"input": TEXTS},
                               headers={"traceparent": traceparent}, timeout=60)
            assert reply.status_code == 200, reply.text
            # The public gRPC API continues a traceparent sent as call metadata.
            with grpc.insecure_channel(address) as channel:
                answer = embeddings_pb2_grpc.EmbeddingsStub(channel).Embed(
                    embeddings_pb2.EmbedTextsRequest(inputs=TEXTS), timeout=60,
                    metadata=(("traceparent", grpc_traceparent),))
            assert len(answer.embeddings) == len(TEXTS)
            assert receiver.spans == []
        of_trace = [(service, span) for service, span in receiver.spans
                    if span.trace_id.hex() == trace_id]
        of_grpc_trace = {(service, span.name): span for service, span in receiver.spans
                         if span.trace_id.hex() == grpc_trace_id}
    rpc = of_grpc_trace[GATEWAY_SERVICE, "embedserve.v1.Embeddings/Embed"]
    assert rpc.parent_span_id.hex() == grpc_parent_id
    assert {a.key: a.value.string_value for a in rpc.attributes}["rpc.grpc.status_code"] == "OK"
    grpc_dispatch = of_grpc_trace[GATEWAY_SERVICE, "dispatch"]
    assert grpc_dispatch.parent_span_id == rpc.span_id
    assert of_grpc_trace[REPLICA_SERVICE, "embedserve.v1.Inference/Embed"].parent_span_id == grpc_dispatch.span_id
    assert receiver.paths == {"/v1/traces"}
    assert len(of_trace) == 8, [(service, span.name) for service, span in of_trace]
    spans = {(service, span.name): span for service, span in of_trace}
    request = spans[GATEWAY_SERVICE, "POST /v1/embeddings"]
    assert request.parent_span_id.hex() == parent_id
    dispatch = spans[GATEWAY_SERVICE, "dispatch"]
    call = spans[REPLICA_SERVICE, "embedserve.v1.Inference/Embed"]
    assert dispatch.parent_span_id == request.span_id
    assert call.parent_span_id == dispatch.span_id
    assert spans[REPLICA_SERVICE, "step"].parent_span_id == call.span_id
    # serve calls its replica over a Unix socket's frames.
    attributes = {a.key: a.value.string_value for a in dispatch.attributes}
    assert attributes["embedserve.replica.transport"] == "frames"
    assert attributes["server.address"].startswith("unix:")


# Serves one request through a real gateway and replica with tracing off, then lists the
# OpenTelemetry SDK modules (and embedserve's spans module) the process holds. FastAPI
# itself imports opentelemetry's API (its own no-op instrumentation), so the API is not asked about.
_TRACING_OFF = """
import json, sys
sys.path[:0] = [{tests!r}]
import httpx
from pathlib import Path
from embedserve.engine import Engine
from embedserve.scheduler.settings import SchedulerSettings
from gateway_harness import GatewayServer, gateway_settings
from scheduler_harness import ThreadedScheduler

model = Path({model!r})
engine = Engine.load(model)
with ThreadedScheduler(SchedulerSettings(model_dir=model, dtype="float32"), engine) as replica:
    gateway = GatewayServer(gateway_settings(model, [f"127.0.0.1:{{replica.port}}"]))
    gateway.wait_ready(healthy=1)
    reply = httpx.post(gateway.url + "/v1/embeddings", json={{"input": ["a text"]}},
                       headers={{"traceparent": "00-{trace_id}-{parent_id}-01"}}, timeout=60)
    gateway.stop()
engine.close()
print(json.dumps([reply.status_code, sorted(m for m in sys.modules
                  if m.startswith(("opentelemetry.sdk", "opentelemetry.exporter", "embedserve.otel")))]))
"""


def test_tracing_off_loads_no_sdk(tiny_bert_dir: Path):
    trace_id, parent_id, _ = _traceparent()
    script = _TRACING_OFF.format(tests=str(ROOT / "tests"), model=str(tiny_bert_dir),
                                 trace_id=trace_id, parent_id=parent_id)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          cwd=ROOT, timeout=300, env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert done.returncode == 0, done.stderr[-3000:]
    status, loaded = json.loads(done.stdout.strip().splitlines()[-1])
    assert status == 200
    assert loaded == []


# --- what turns tracing on: --otlp-endpoint and the OTEL_* variables -------------------

@pytest.mark.parametrize(("flag", "environ", "endpoint"), [
    (None, {}, None),                                                       # off by default
    ("http://collector:4318", {}, "http://collector:4318/v1/traces"),
    ("http://collector:4318/v1/traces", {}, "http://collector:4318/v1/traces"),
    (None, {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318/"}, "http://c:4318/v1/traces"),
    # the per-signal variable is a full URL, used as it is (the OTLP exporter specification)
    (None, {"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://c:9999/traces"}, "http://c:9999/traces"),
    ("http://flag:4318", {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://env:4318"}, "http://flag:4318/v1/traces"),
    ("http://c:4318", {"OTEL_SDK_DISABLED": "true"}, None),
    ("http://c:4318", {"OTEL_TRACES_EXPORTER": "none"}, None),
])
def test_what_turns_tracing_on(flag, environ, endpoint):
    settings = tracing_settings(flag, environ, "embedserve-gateway")
    assert (settings.endpoint if settings is not None else None) == endpoint


def test_the_standard_variables_name_the_service_sampler_and_headers():
    settings = tracing_settings(None, {"OTEL_EXPORTER_OTLP_ENDPOINT": "https://c:4318",
                                       "OTEL_SERVICE_NAME": "search-embedder",
                                       "OTEL_TRACES_SAMPLER": "parentbased_traceidratio",
                                       "OTEL_TRACES_SAMPLER_ARG": "0.25",
                                       "OTEL_EXPORTER_OTLP_HEADERS": "x-api-key=s3cret,x-team=search",
                                       "OTEL_RESOURCE_ATTRIBUTES": "deployment.environment=prod"},
                                "embedserve-replica")
    assert settings is not None
    assert (settings.service_name, settings.sampler, settings.sampler_arg) == \
        ("search-embedder", "parentbased_traceidratio", 0.25)
    assert settings.headers == (("x-api-key", "s3cret"), ("x-team", "search"))
    assert settings.resource_attributes == (("deployment.environment", "prod"),)
    assert "s3cret" not in repr(settings)
    assert tracing_settings("http://c:4318", {}, "embedserve-replica").service_name == "embedserve-replica"


@pytest.mark.parametrize(("flag", "environ", "says"), [
    ("collector:4318", {}, "not an http:// or https:// URL"),
    ("http://c:4317", {"OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}, "http/protobuf"),
    ("http://c:4318", {"OTEL_TRACES_SAMPLER": "sometimes"}, "OTEL_TRACES_SAMPLER=sometimes"),
    ("http://c:4318", {"OTEL_TRACES_SAMPLER_ARG": "2"}, "OTEL_TRACES_SAMPLER_ARG=2"),
    ("http://c:4318", {"OTEL_TRACES_EXPORTER": "zipkin"}, "OTEL_TRACES_EXPORTER=zipkin"),
])
def test_a_setting_that_cannot_work_is_refused_with_its_fix(flag, environ, says):
    with pytest.raises(StartupError, match=re.escape(says)):
        tracing_settings(flag, environ, "embedserve-gateway")


def test_a_bad_endpoint_stops_the_gateway_with_one_line():
    done = subprocess.run([sys.executable, "-m", "embedserve.cli", "gateway", "--upstream",
                           "127.0.0.1:1", "--otlp-endpoint", "collector:4318"],
                          capture_output=True, text=True, cwd=ROOT, timeout=120,
                          env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        "embedserve: error: OTLP endpoint 'collector:4318' is not an http:// or https:// "
        "URL; give the collector's OTLP/HTTP address, e.g. http://localhost:4318"]


def test_probes_and_scrapes_make_no_spans(gateway, exporter):
    trace_id, parent_id, traceparent = _traceparent()
    for path in ("/health", "/ready", "/metrics"):
        assert httpx.get(gateway.url + path, headers={"traceparent": traceparent}, timeout=30).status_code == 200
    marker, _, sampled = _traceparent()    # a traced request after them: their spans would be in by then
    assert httpx.post(gateway.url + "/v1/embeddings", json={"input": TEXTS},
                      headers={"traceparent": sampled}, timeout=60).status_code == 200
    _spans_of(exporter, marker, 8)
    assert not [s for s in exporter.get_finished_spans()
                if format(s.context.trace_id, "032x") == trace_id]
