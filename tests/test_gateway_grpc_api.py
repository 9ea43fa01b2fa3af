"""The public gRPC API (embedserve.v1.Embeddings) of a real ``embedserve serve --grpc-port 0``.

One stack for the module: a tiny embedder (prompts query:/passage:, normalized)
and a tiny reranker, an API key, a small token budget and message limit so the
limits can be reached cheaply. Checked with the generated stubs: the same
vectors (every embedding type, dimensions, prompts), rerank scores and tokens as
the HTTP routes give for the same inputs; EmbedStream's order and per-message
errors; health and reflection; and hostile input, each answered with a clear
status (never UNKNOWN or INTERNAL) while a valid call is served during and after.
"""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
import httpx
import numpy as np
import pytest
from google.rpc import error_details_pb2
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc
from grpc_status import rpc_status

from embedserve.protos import embeddings_pb2 as pb
from embedserve.protos import embeddings_pb2_grpc
from serve_harness import served_with_grpc

KEY = "grpc-test-key"
AUTH = (("authorization", f"Bearer {KEY}"),)
BATCH_KEY = "grpc-batch-key"
HEADERS = {"Authorization": f"Bearer {KEY}"}
MAX_MESSAGE_BYTES = 1_000_000
MAX_INPUTS = 64
BUDGET_TOKENS = 4096
# Generous: a replica's first call of a new shape compiles kernels, slow on a busy machine.
TIMEOUT_S = 300
TEXTS = ["the quick brown fox jumps over the lazy dog", "héllo wörld", "a third, longer text " * 5]
ALL_TYPES = ["float", "int8", "uint8", "binary", "ubinary", "float16"]
BYTE_TYPES = {"int8": np.int8, "uint8": np.uint8, "binary": np.int8, "ubinary": np.uint8,
              "float16": np.dtype("<f2")}


class Stack:
    def __init__(self, url: str, address: str) -> None:
        self.url = url
        self.channel = grpc.insecure_channel(address)
        self.stub = embeddings_pb2_grpc.EmbeddingsStub(self.channel)
        self.http = httpx.Client(base_url=url, headers=HEADERS, timeout=TIMEOUT_S)

    def post(self, path: str, body: dict) -> object:
        reply = self.http.post(path, json=body)
        assert reply.status_code == 200, reply.text
        return reply.json()

    def assert_serving(self) -> None:
        """A valid call is answered: the server kept serving."""
        reply = self.stub.Embed(pb.EmbedTextsRequest(inputs=["still serving"]), metadata=AUTH,
                                timeout=TIMEOUT_S)
        assert len(reply.embeddings) == 1 and len(reply.embeddings[0].float) == 32


@pytest.fixture(scope="module")
def stack(tiny_bert_dir: Path, tiny_reranker_dir: Path) -> Iterator[Stack]:
    with served_with_grpc("--model", f"{tiny_bert_dir}:name=embedder",
                          "--model", f"{tiny_reranker_dir}:name=reranker", "--api-key", KEY,
                          "--batch-api-key", BATCH_KEY,
                          "--max-body-bytes", str(MAX_MESSAGE_BYTES), "--max-inputs",
                          str(MAX_INPUTS), "--max-inflight-tokens", str(BUDGET_TOKENS)) as (url, address):
        s = Stack(url, address)
        try:
            yield s
        finally:
            s.channel.close()
            s.http.close()


def _rows(embeddings, name: str) -> np.ndarray:
    if name == "float":
        return np.array([list(e.float) for e in embeddings], dtype=np.float32)
    return np.stack([np.frombuffer(getattr(e, name), dtype=BYTE_TYPES[name]) for e in embeddings])


# -- the same answers as HTTP ---------------------------------------------------

@pytest.mark.parametrize("dimensions,input_type,http_input_type",
                         [(None, pb.INPUT_TYPE_UNSPECIFIED, None), (16, pb.INPUT_TYPE_QUERY, "query"),
                          (8, pb.INPUT_TYPE_DOCUMENT, "passage")])
def test_embed_gives_http_vectors_in_every_type(stack: Stack, dimensions, input_type,
                                                http_input_type) -> None:
    request = pb.EmbedTextsRequest(inputs=TEXTS, model="embedder", input_type=input_type,
                                   embedding_types=ALL_TYPES, dimensions=dimensions)
    reply = stack.stub.Embed(request, metadata=AUTH, timeout=TIMEOUT_S)
    body = {"input": TEXTS, "model": "embedder", "embedding_types": ALL_TYPES}
    if dimensions is not None:
        body["dimensions"] = dimensions
    if http_input_type is not None:
        body["input_type"] = http_input_type
    http = stack.post("/v1/embeddings", body)
    assert reply.model == "embedder"
    assert reply.usage.total_tokens == http["usage"]["total_tokens"] > 0
    for name in ALL_TYPES:
        expected = np.array([d["embedding"][name] for d in http["data"]])
        got = _rows(reply.embeddings, name)
        assert got.shape == expected.shape and got.shape[0] == len(TEXTS), name
        assert np.array_equal(got, expected.astype(got.dtype)), name
    assert _rows(reply.embeddings, "float").shape[1] == (dimensions or 32)


def test_chunking_plain_floats_and_normalize_follow_http(stack: Stack) -> None:
    long_text = "many words in a long document " * 200   # beyond the 512-token window
    reply = stack.stub.Embed(pb.EmbedTextsRequest(inputs=[long_text, "short"], truncate="chunk",
                                                  embedding_types=["float", "int8"]),
                             metadata=AUTH, timeout=TIMEOUT_S)
    http = stack.post("/v1/embeddings", {"input": [long_text, "short"], "truncate": "chunk",
                                         "embedding_types": ["float", "int8"]})
    for name in ("float", "int8"):
        expected = np.array([d["embedding"][name] for d in http["data"]])
        assert np.array_equal(_rows(reply.embeddings, name), expected.astype(BYTE_TYPES.get(name, np.float32)))
    assert reply.usage.total_tokens == http["usage"]["total_tokens"] > 512
    plain = stack.stub.Embed(pb.EmbedTextsRequest(inputs=TEXTS, dimensions=24), metadata=AUTH,
                             timeout=TIMEOUT_S)
    assert all(not e.int8 and len(e.float) == 24 for e in plain.embeddings)
    http = stack.post("/v1/embeddings", {"input": TEXTS, "dimensions": 24})
    assert np.array_equal(_rows(plain.embeddings, "float"),
                          np.array([d["embedding"] for d in http["data"]], dtype=np.float32))
    # normalize=false: the raw vectors, as TEI's /embed gives them.
    raw = stack.stub.Embed(pb.EmbedTextsRequest(inputs=TEXTS, normalize=False), metadata=AUTH,
                           timeout=TIMEOUT_S)
    tei = stack.post("/embed", {"inputs": TEXTS, "normalize": False})
    assert np.array_equal(_rows(raw.embeddings, "float"), np.array(tei, dtype=np.float32))
    assert not np.allclose(np.linalg.norm(_rows(raw.embeddings, "float"), axis=1), 1.0)


def test_rerank_gives_http_scores(stack: Stack) -> None:
    docs = ["a fox in the forest", "stock prices fell", "the quick brown fox", "weather today"]
    reply = stack.stub.Rerank(pb.RerankRequest(query="quick fox", documents=docs, top_n=3,
                                               return_documents=True), metadata=AUTH, timeout=TIMEOUT_S)
    http = stack.post("/v1/rerank", {"query": "quick fox", "documents": docs, "top_n": 3,
                                     "return_documents": True})
    assert reply.model == http["model"] == "reranker"
    assert [(r.index, r.document) for r in reply.results] == \
        [(r["index"], r["document"]["text"]) for r in http["results"]]
    assert [r.score for r in reply.results] == \
        [float(np.float32(r["relevance_score"])) for r in http["results"]]
    raw = stack.stub.Rerank(pb.RerankRequest(query="quick fox", documents=docs, raw_scores=True),
                            metadata=AUTH, timeout=TIMEOUT_S)
    tei = stack.post("/rerank", {"query": "quick fox", "texts": docs, "raw_scores": True})
    assert [(r.index, r.score) for r in raw.results] == \
        [(r["index"], float(np.float32(r["score"]))) for r in tei]
    assert all(r.document == "" for r in raw.results)


@pytest.mark.parametrize("add_special_tokens", [None, False])
def test_tokenize_gives_http_tokens(stack: Stack, add_special_tokens) -> None:
    texts = ["héllo wörld", "<s> looks special"]
    reply = stack.stub.Tokenize(pb.TokenizeRequest(inputs=texts, model="embedder", prompt_name="query",
                                                   add_special_tokens=add_special_tokens),
                                metadata=AUTH, timeout=TIMEOUT_S)
    body = {"inputs": texts, "model": "embedder", "prompt_name": "query"}
    if add_special_tokens is not None:
        body["add_special_tokens"] = add_special_tokens
    http = stack.post("/tokenize", body)
    got = [[{"id": t.id, "text": t.text, "piece": t.piece, "special": t.special,
             "start": t.start if t.HasField("start") else None,
             "stop": t.stop if t.HasField("stop") else None} for t in row.tokens]
           for row in reply.inputs]
    assert got == http


def test_info_lists_the_served_models(stack: Stack) -> None:
    info = stack.stub.Info(pb.ServiceInfoRequest(), metadata=AUTH, timeout=TIMEOUT_S)
    models = {m.name: m for m in info.models}
    assert set(models) == {"embedder", "reranker"}
    assert (models["embedder"].task, models["embedder"].dimension) == ("embed", 32)
    assert list(models["embedder"].prompts) == ["passage", "query"]
    assert (models["reranker"].task, models["reranker"].dimension) == ("score", 0)
    assert models["embedder"].max_input_tokens == 512
    assert info.max_inputs == MAX_INPUTS and info.max_message_bytes == MAX_MESSAGE_BYTES
    assert set(info.embedding_types) == set(ALL_TYPES)


# -- EmbedStream ------------------------------------------------------------------

def test_embed_stream_answers_in_order_and_errors_per_message(stack: Stack) -> None:
    requests = [pb.EmbedTextsRequest(inputs=[f"text number {i}"] * (1 + i % 3)) for i in range(24)]
    requests[3] = pb.EmbedTextsRequest(inputs=[])
    requests[7] = pb.EmbedTextsRequest(inputs=["x"], embedding_types=["float", "int4"])
    requests[11] = pb.EmbedTextsRequest(inputs=["x"], model="nobody")
    answers = list(stack.stub.EmbedStream(iter(requests), metadata=AUTH, timeout=TIMEOUT_S))
    assert [a.index for a in answers] == list(range(24))
    failed = {a.index: a.error for a in answers if a.WhichOneof("result") == "error"}
    assert set(failed) == {3, 7, 11}
    assert (failed[3].code, failed[3].field) == (grpc.StatusCode.INVALID_ARGUMENT.value[0], "inputs")
    assert (failed[7].code, failed[7].field) == (grpc.StatusCode.INVALID_ARGUMENT.value[0],
                                                 "embedding_types[1]")
    assert (failed[11].code, failed[11].reason) == (grpc.StatusCode.NOT_FOUND.value[0],
                                                    "model_not_found")
    for answer in answers:
        if answer.index in failed:
            continue
        alone = stack.stub.Embed(requests[answer.index], metadata=AUTH, timeout=TIMEOUT_S)
        assert np.array_equal(_rows(answer.response.embeddings, "float"),
                              _rows(alone.embeddings, "float"))


def test_embed_stream_needs_the_key(stack: Stack) -> None:
    with pytest.raises(grpc.RpcError) as caught:
        list(stack.stub.EmbedStream(iter([pb.EmbedTextsRequest(inputs=["x"])]), timeout=TIMEOUT_S))
    assert caught.value.code() == grpc.StatusCode.UNAUTHENTICATED


# -- health and reflection ------------------------------------------------------

def test_health_is_serving_without_a_key(stack: Stack) -> None:
    health = health_pb2_grpc.HealthStub(stack.channel)
    for service in ("", "embedserve.v1.Embeddings"):
        reply = health.Check(health_pb2.HealthCheckRequest(service=service), timeout=TIMEOUT_S)
        assert reply.status == health_pb2.HealthCheckResponse.SERVING


def test_reflection_lists_the_service(stack: Stack) -> None:
    reflection = reflection_pb2_grpc.ServerReflectionStub(stack.channel)
    replies = list(reflection.ServerReflectionInfo(
        iter([reflection_pb2.ServerReflectionRequest(list_services="")]), timeout=TIMEOUT_S))
    names = {s.name for s in replies[0].list_services_response.service}
    assert {"embedserve.v1.Embeddings", "grpc.health.v1.Health"} <= names
    described = list(reflection.ServerReflectionInfo(iter([reflection_pb2.ServerReflectionRequest(
        file_containing_symbol="embedserve.v1.Embeddings")]), timeout=TIMEOUT_S))
    assert described[0].file_descriptor_response.file_descriptor_proto


# -- hostile input ----------------------------------------------------------------

def _details(error: grpc.RpcError) -> dict[str, object]:
    """The rich status's details by their type name."""
    status = rpc_status.from_call(error)
    assert status is not None, "no google.rpc.Status details"
    found: dict[str, object] = {}
    for any_detail in status.details:
        for kind in (error_details_pb2.ErrorInfo, error_details_pb2.BadRequest,
                     error_details_pb2.RetryInfo):
            if any_detail.Is(kind.DESCRIPTOR):
                detail = kind()
                any_detail.Unpack(detail)
                found[kind.__name__] = detail
    return found


_EMBED = "Embed"
HOSTILE = [
    ("empty inputs", _EMBED, pb.EmbedTextsRequest(inputs=[]), "INVALID_ARGUMENT", "inputs"),
    ("empty string", _EMBED, pb.EmbedTextsRequest(inputs=["ok", ""]), "INVALID_ARGUMENT", "inputs[1]"),
    ("too many inputs", _EMBED, pb.EmbedTextsRequest(inputs=["x"] * (MAX_INPUTS + 1)),
     "INVALID_ARGUMENT", "inputs"),
    ("bad embedding type", _EMBED, pb.EmbedTextsRequest(inputs=["x"], embedding_types=["float", "int4"]),
     "INVALID_ARGUMENT", "embedding_types[1]"),
    ("dimensions 0", _EMBED, pb.EmbedTextsRequest(inputs=["x"], dimensions=0), "INVALID_ARGUMENT",
     "dimensions"),
    ("dimensions too large", _EMBED, pb.EmbedTextsRequest(inputs=["x"], dimensions=33),
     "INVALID_ARGUMENT", "dimensions"),
    ("bad truncate", _EMBED, pb.EmbedTextsRequest(inputs=["x"], truncate="sideways"),
     "INVALID_ARGUMENT", "truncate"),
    ("chunk overlap", _EMBED, pb.EmbedTextsRequest(inputs=["x"], truncate="chunk", chunk_overlap=5000),
     "INVALID_ARGUMENT", "chunk_overlap"),
    ("unknown input type", _EMBED, pb.EmbedTextsRequest(inputs=["x"], input_type=9),
     "INVALID_ARGUMENT", "input_type"),
    ("unknown model", _EMBED, pb.EmbedTextsRequest(inputs=["x"], model="gpt-17"), "NOT_FOUND", "model"),
    ("reranker asked to embed", _EMBED, pb.EmbedTextsRequest(inputs=["x"], model="reranker"),
     "INVALID_ARGUMENT", "model"),
    ("empty query", "Rerank", pb.RerankRequest(query="", documents=["d"]), "INVALID_ARGUMENT", "query"),
    ("no documents", "Rerank", pb.RerankRequest(query="q"), "INVALID_ARGUMENT", "documents"),
    ("top_n 0", "Rerank", pb.RerankRequest(query="q", documents=["d"], top_n=0), "INVALID_ARGUMENT",
     "top_n"),
    ("long document", "Rerank", pb.RerankRequest(query="q", documents=["d", "word " * 2000]),
     "INVALID_ARGUMENT", "documents[1]"),
    ("unknown prompt", "Tokenize", pb.TokenizeRequest(inputs=["x"], model="embedder", prompt_name="nope"),
     "INVALID_ARGUMENT", "prompt_name"),
    ("tokenize no model", "Tokenize", pb.TokenizeRequest(inputs=["x"]), "INVALID_ARGUMENT", "model"),
]


@pytest.mark.parametrize("case,method,request_,code,field", HOSTILE, ids=[c[0] for c in HOSTILE])
def test_bad_input_gets_a_clear_status(stack: Stack, case, method, request_, code, field) -> None:
    with pytest.raises(grpc.RpcError) as caught:
        getattr(stack.stub, method)(request_, metadata=AUTH, timeout=TIMEOUT_S)
    error = caught.value
    assert error.code().name == code, error.details()
    info = _details(error)["ErrorInfo"]
    assert info.domain == "embedserve" and info.metadata["field"] == field
    if code == "INVALID_ARGUMENT":
        violation = _details(error)["BadRequest"].field_violations[0]
        assert violation.field == field and violation.description
    stack.assert_serving()


def test_an_input_too_long_names_its_index_and_the_fix_while_others_are_served(stack: Stack) -> None:
    huge = "a very long text " * 20_000   # 340 KB: within the message limit, far beyond the window
    with ThreadPoolExecutor(2) as pool:
        refused = pool.submit(stack.stub.Embed, pb.EmbedTextsRequest(inputs=["fine", huge]),
                              metadata=AUTH, timeout=TIMEOUT_S)
        stack.assert_serving()
        with pytest.raises(grpc.RpcError) as caught:
            refused.result()
    error = caught.value
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    details = _details(error)
    assert details["ErrorInfo"].reason == "input_too_long"
    violation = details["BadRequest"].field_violations[0]
    assert violation.field == "inputs[1]" and "truncate" in violation.description
    cut = stack.stub.Embed(pb.EmbedTextsRequest(inputs=["fine", huge], truncate="right"),
                           metadata=AUTH, timeout=TIMEOUT_S)
    assert len(cut.embeddings) == 2 and cut.usage.total_tokens <= 2 * 512
    stack.assert_serving()


@pytest.mark.parametrize("metadata", [(), (("authorization", "Bearer wrong"),),
                                      (("authorization", KEY),)], ids=["missing", "wrong", "no-bearer"])
def test_calls_without_the_key_are_unauthenticated(stack: Stack, metadata) -> None:
    for method, request in [("Embed", pb.EmbedTextsRequest(inputs=["x"])),
                            ("Info", pb.ServiceInfoRequest())]:
        with pytest.raises(grpc.RpcError) as caught:
            getattr(stack.stub, method)(request, metadata=metadata, timeout=TIMEOUT_S)
        assert caught.value.code() == grpc.StatusCode.UNAUTHENTICATED
    stack.assert_serving()


def test_an_oversized_message_is_refused_before_parsing(stack: Stack) -> None:
    big = "x" * (MAX_MESSAGE_BYTES + 1000)
    with pytest.raises(grpc.RpcError) as caught:
        stack.stub.Embed(pb.EmbedTextsRequest(inputs=[big]), metadata=AUTH, timeout=TIMEOUT_S)
    assert caught.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    stack.assert_serving()


def test_the_client_deadline_bounds_the_call(stack: Stack) -> None:
    # Within the token budget (16 x ~200 tokens): a request over it is refused as invalid
    # as soon as it is tokenized, which a warm tokenizer can do inside the 1 ms.
    request = pb.EmbedTextsRequest(inputs=[f"text {i} " * 100 for i in range(16)])
    with pytest.raises(grpc.RpcError) as caught:
        stack.stub.Embed(request, metadata=AUTH, timeout=0.001)
    assert caught.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED, caught.value.details()
    stack.assert_serving()


def test_a_full_token_budget_is_resource_exhausted_with_retry_info(stack: Stack) -> None:
    # Each call holds ~3,900 of the 4,096-token budget while its replica works: calls sent
    # together cannot all fit, so some are refused at once rather than queued.
    request = pb.EmbedTextsRequest(inputs=[f"budget filler {i} " + "word " * 230 for i in range(16)])
    with ThreadPoolExecutor(8) as pool:
        futures = [pool.submit(stack.stub.Embed, request, metadata=AUTH, timeout=TIMEOUT_S) for _ in range(8)]
        outcomes = []
        for future in futures:
            try:
                outcomes.append(len(future.result().embeddings))
            except grpc.RpcError as error:
                outcomes.append(error)
    refused = [o for o in outcomes if isinstance(o, grpc.RpcError)]
    assert refused and len(refused) < len(outcomes)
    for error in refused:
        assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, error.details()
        details = _details(error)
        assert details["ErrorInfo"].reason == "overloaded"
        assert details["RetryInfo"].retry_delay.seconds >= 1
    assert all(o == 16 for o in outcomes if not isinstance(o, grpc.RpcError))
    stack.assert_serving()


def test_grpc_calls_are_counted_in_the_gateway_metrics(stack: Stack) -> None:
    with pytest.raises(grpc.RpcError):
        stack.stub.Embed(pb.EmbedTextsRequest(inputs=[]), metadata=AUTH, timeout=TIMEOUT_S)
    stack.assert_serving()
    text = httpx.get(stack.url + "/metrics", timeout=TIMEOUT_S).text
    assert 'embedserve_gateway_requests_total{route="/embedserve.v1.Embeddings/Embed",' \
           'status="INVALID_ARGUMENT"}' in text
    assert 'embedserve_gateway_requests_total{route="/embedserve.v1.Embeddings/Embed",status="OK"}' in text
    assert 'embedserve_gateway_tokens_total{model="embedder",route="/embedserve.v1.Embeddings/Embed"}' in text


def _class_counts(stack: Stack) -> dict[str, float]:
    """The gateway's per-class request counts (embedserve_gateway_class_request_seconds_count)."""
    text = httpx.get(stack.url + "/metrics", timeout=TIMEOUT_S).text
    counts = {}
    for line in text.splitlines():
        if line.startswith("embedserve_gateway_class_request_seconds_count{"):
            counts[line.split('priority="')[1].split('"')[0]] = float(line.rsplit(" ", 1)[1])
    return counts


@pytest.mark.parametrize(("metadata", "expected"), [
    ((*AUTH, ("x-embedserve-priority", "batch")), "batch"),
    ((*AUTH, ("x-embedserve-priority", " Interactive ")), "interactive"),
    (AUTH, "interactive"),
    # a batch key forces the class, whatever the call asks (docs/priority.md)
    ((("authorization", f"Bearer {BATCH_KEY}"), ("x-embedserve-priority", "interactive")), "batch"),
], ids=["metadata-batch", "metadata-interactive", "default", "batch-key"])
def test_a_call_runs_in_the_class_its_metadata_or_key_names(stack: Stack, metadata, expected) -> None:
    before = _class_counts(stack)
    reply = stack.stub.Embed(pb.EmbedTextsRequest(inputs=["which class am I"]), metadata=metadata,
                             timeout=TIMEOUT_S)
    assert len(reply.embeddings) == 1
    after = _class_counts(stack)
    other = "batch" if expected == "interactive" else "interactive"
    assert after.get(expected, 0.0) == before.get(expected, 0.0) + 1
    assert after.get(other, 0.0) == before.get(other, 0.0)


def test_an_unknown_priority_class_is_invalid_argument(stack: Stack) -> None:
    with pytest.raises(grpc.RpcError) as caught:
        stack.stub.Embed(pb.EmbedTextsRequest(inputs=["x"]), metadata=(*AUTH, ("x-embedserve-priority", "urgent")),
                         timeout=TIMEOUT_S)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "x-embedserve-priority" in caught.value.details()
    stack.assert_serving()
