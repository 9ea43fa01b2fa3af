"""Quantized embeddings through a real stack: HTTP -> gateway -> gRPC -> scheduler -> engine.

One scheduler process serves the default model with its calibration in a
test-owned cache directory; the references are sentence-transformers'
``quantize_embeddings`` applied to the same server's float answer with the
ranges the server reports, so every int8/uint8/binary/ubinary answer must
equal it byte for byte. Also: the gRPC Embed's packed bytes, the calibration
surviving a replica restart unchanged, and 400s for unknown types.
"""

from __future__ import annotations

import base64
import hashlib

import grpc
import numpy as np
import pytest
from sentence_transformers.util.quantization import quantize_embeddings

from embedserve.link import wire
from embedserve.model.calibration_texts import CALIBRATION_TEXTS, TEXTS_ID
from embedserve.protos import inference_pb2, inference_pb2_grpc
from gateway_harness import GatewayServer, SchedulerProcess, gateway_settings

TEXTS = ["query: how cold is the arctic in winter", "passage: Kuala Lumpur ialah ibu negara Malaysia.",
         "Le réchauffement climatique menace la biodiversité.", "東京は日本の首都です。",
         "a", "def f(x): return x * 2"]
TYPES = ["float", "int8", "uint8", "binary", "ubinary"]
DTYPES = {"int8": np.int8, "uint8": np.uint8, "binary": np.int8, "ubinary": np.uint8,
          "float": np.float32, "float16": np.float16}


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("calibration-cache")


@pytest.fixture(scope="module")
def replica(default_model_dir, cache_dir):
    process = SchedulerProcess(default_model_dir, "--cache-dir", str(cache_dir), threads=1)
    try:
        yield process
    finally:
        process.stop()


@pytest.fixture(scope="module")
def gateway(default_model_dir, replica):
    server = GatewayServer(gateway_settings(default_model_dir, [replica.address],
                                            request_timeout_s=300))
    try:
        server.wait_ready()
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def http(gateway):
    with gateway.client() as client:
        yield client


def float_vectors(http, texts, dimensions=None) -> np.ndarray:
    body = {"input": texts, **({"dimensions": dimensions} if dimensions else {})}
    reply = http.post("/v1/embeddings", json=body)
    assert reply.status_code == 200, reply.text
    return np.array([d["embedding"] for d in reply.json()["data"]], dtype=np.float32)


def server_ranges(http, dimensions=None, normalize=None) -> np.ndarray:
    params = {k: v for k, v in (("dimensions", dimensions), ("normalize", normalize)) if v is not None}
    reply = http.get("/v1/quantization/ranges", params=params)
    assert reply.status_code == 200, reply.text
    body = reply.json()
    ranges = np.array(body["ranges"], dtype=np.float32)
    assert ranges.shape == (2, body["dimensions"])
    return ranges


def reference(vectors: np.ndarray, kind: str, ranges: np.ndarray) -> np.ndarray:
    if kind == "float16":
        return vectors.astype(np.float16)
    return quantize_embeddings(vectors, "float32" if kind == "float" else kind, ranges=ranges)


@pytest.mark.parametrize("dimensions", [None, 100])
def test_openai_embedding_types_equal_quantize_embeddings(http, dimensions):
    floats = float_vectors(http, TEXTS, dimensions)
    ranges = server_ranges(http, dimensions)
    body = {"input": TEXTS, "embedding_types": TYPES + ["float16"],
            **({"dimensions": dimensions} if dimensions else {})}
    reply = http.post("/v1/embeddings", json=body)
    assert reply.status_code == 200, reply.text
    data = reply.json()["data"]
    assert [d["index"] for d in data] == list(range(len(TEXTS)))
    for kind in TYPES + ["float16"]:
        ours = np.array([d["embedding"][kind] for d in data]).astype(DTYPES[kind])
        expected = reference(floats, kind, ranges)
        assert ours.shape == expected.shape, kind
        assert np.array_equal(ours, expected), kind
    # The uint8 buckets actually spread out (not all clipped to one end).
    uint8 = np.array([d["embedding"]["uint8"] for d in data])
    assert 50 < uint8.mean() < 205 and uint8.std() > 20


def test_base64_rows_are_the_little_endian_bytes(http):
    floats = float_vectors(http, TEXTS)
    ranges = server_ranges(http)
    reply = http.post("/v1/embeddings", json={"input": TEXTS, "embedding_types": ["int8", "ubinary", "float"],
                                               "encoding_format": "base64"})
    assert reply.status_code == 200, reply.text
    for kind, dtype in (("int8", "i1"), ("ubinary", "u1"), ("float", "<f4")):
        rows = np.stack([np.frombuffer(base64.b64decode(d["embedding"][kind]), dtype=dtype)
                         for d in reply.json()["data"]])
        assert np.array_equal(rows, reference(floats, kind, ranges)), kind


def test_plain_openai_answer_unchanged_and_float_type_identical(http):
    plain = http.post("/v1/embeddings", json={"input": TEXTS}).json()
    typed = http.post("/v1/embeddings", json={"input": TEXTS, "embedding_types": ["float"]}).json()
    assert all(isinstance(d["embedding"], list) for d in plain["data"])
    assert [d["embedding"] for d in plain["data"]] == [d["embedding"]["float"] for d in typed["data"]]
    assert plain["usage"] == typed["usage"]


def test_tei_embed_unnormalized_truncated(http):
    # normalize=False with dimensions: ranges calibrated on raw truncated vectors.
    floats = http.post("/embed", json={"inputs": TEXTS, "normalize": False, "dimensions": 64}).json()
    floats = np.array(floats, dtype=np.float32)
    ranges = server_ranges(http, 64, False)
    reply = http.post("/embed", json={"inputs": TEXTS, "normalize": False, "dimensions": 64,
                                      "embedding_types": ["uint8", "binary"]})
    assert reply.status_code == 200, reply.text
    body = reply.json()
    assert body["response_type"] == "embeddings_by_type"
    for kind in ("uint8", "binary"):
        assert np.array_equal(np.array(body["embeddings"][kind]).astype(DTYPES[kind]),
                              reference(floats, kind, ranges)), kind
    # Raw (unnormalized) ranges differ from the normalized ones of the same width.
    assert not np.array_equal(ranges, server_ranges(http, 64, True))


def test_grpc_embed_returns_packed_quantized_bytes(replica):
    ids = np.array([0, 35378, 8999, 9, 2, 0, 6, 2], dtype=np.int32)
    tokens = wire.pack_tokens(wire.unpack_tokens(inference_pb2.PackedTokens(
        token_ids=ids.tobytes(), lengths=np.array([5, 3], dtype=np.int32).tobytes())))
    with grpc.insecure_channel(replica.address) as channel:
        stub = inference_pb2_grpc.InferenceStub(channel)
        floats = wire.tensor_to_array(stub.Embed(inference_pb2.EmbedRequest(
            tokens=tokens, normalize=True, dimensions=200)).embeddings)
        ranges = wire.tensor_to_array(stub.Ranges(inference_pb2.RangesRequest(
            dimensions=200, normalize=True)).ranges)
        kinds = ["int8", "uint8", "binary", "ubinary"]
        reply = stub.Embed(inference_pb2.EmbedRequest(
            tokens=tokens, normalize=True, dimensions=200,
            precisions=wire.precisions_to_proto(kinds)))
    assert reply.embeddings.data == b""
    assert len(reply.quantized) == len(kinds)
    for kind, tensor in zip(kinds, reply.quantized):
        expected = quantize_embeddings(floats, kind, ranges=ranges)
        assert list(tensor.shape) == list(expected.shape), kind
        assert tensor.data == expected.tobytes(), kind


def test_info_reports_the_calibration(http, replica):
    whole = http.get("/info").json()
    info = whole["quantization"]
    assert [r["calibration_id"] for r in whole["replicas"]] == [info["calibration_id"]]
    assert info["embedding_types"] == ["float", "float16", "int8", "uint8", "binary", "ubinary"]
    # Each text under each of the model's two prompts (query:, passage:).
    assert info["calibration_sample_size"] == 2 * len(CALIBRATION_TEXTS)
    assert info["calibration_texts_id"] == TEXTS_ID
    ranges = http.get("/v1/quantization/ranges").json()
    assert ranges["calibration_id"] == info["calibration_id"] and len(info["calibration_id"]) == 16


def test_unknown_embedding_type_is_400_naming_it(http):
    for route, body in (("/v1/embeddings", {"input": "x", "embedding_types": ["int8", "int4"]}),
                        ("/embed", {"inputs": "x", "embedding_types": ["int8", "int4"]})):
        reply = http.post(route, json=body)
        assert reply.status_code == 400, reply.text
        error = reply.json()["error"]
        assert error["param"] == "embedding_types[1]" and "int4" in error["message"]
    assert http.post("/v1/embeddings", json={"input": "x", "embedding_types": []}).status_code == 422
    reply = http.get("/v1/quantization/ranges", params={"dimensions": 999})
    assert reply.status_code == 400 and reply.json()["error"]["param"] == "dimensions"


def _digests(directory) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(directory.iterdir())}


def test_calibration_survives_a_replica_restart_byte_for_byte(http, gateway, replica, cache_dir):
    [directory] = (cache_dir / "calibration").iterdir()
    before_ranges = server_ranges(http, 100)
    before_id = http.get("/info").json()["quantization"]["calibration_id"]
    before_files = _digests(directory)
    mtimes = {p.name: p.stat().st_mtime_ns for p in directory.iterdir()}
    assert {"sample.npy", "calibration.json", "ranges-100-normalized.npy"} <= set(before_files)

    replica.stop()
    replica.start()          # same port; reads the stored calibration instead of computing one
    gateway.wait_ready()
    after_ranges = server_ranges(http, 100)
    assert after_ranges.tobytes() == before_ranges.tobytes()
    assert http.get("/v1/quantization/ranges", params={"dimensions": 100}).json()["calibration_id"] \
        == before_id
    assert _digests(directory) == before_files
    assert {p.name: p.stat().st_mtime_ns for p in directory.iterdir()} == mtimes


def test_replica_without_calibration_refuses_int8_but_serves_binary(tiny_bert_dir):
    process = SchedulerProcess(tiny_bert_dir, "--no-calibration", threads=1)
    try:
        tokens = inference_pb2.PackedTokens(token_ids=np.array([0, 35378, 2], np.int32).tobytes(),
                                            lengths=np.array([3], np.int32).tobytes())
        with grpc.insecure_channel(process.address) as channel:
            stub = inference_pb2_grpc.InferenceStub(channel)
            assert stub.Info(inference_pb2.InfoRequest()).calibration_id == ""
            floats = wire.tensor_to_array(stub.Embed(inference_pb2.EmbedRequest(
                tokens=tokens, normalize=True)).embeddings)
            reply = stub.Embed(inference_pb2.EmbedRequest(
                tokens=tokens, normalize=True, precisions=wire.precisions_to_proto(["ubinary"])))
            assert reply.quantized[0].data == quantize_embeddings(floats, "ubinary").tobytes()
            for call, request in ((stub.Embed, inference_pb2.EmbedRequest(
                    tokens=tokens, precisions=wire.precisions_to_proto(["float32", "int8"]))),
                    (stub.Ranges, inference_pb2.RangesRequest())):
                with pytest.raises(grpc.RpcError) as caught:
                    call(request)
                assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
                assert "calibration" in caught.value.details()
    finally:
        process.stop()


def test_calibrate_only_bakes_what_a_replica_then_reads(tiny_bert_dir, tmp_path):
    import subprocess
    import sys

    from embedserve import calibration

    result = subprocess.run([sys.executable, "-m", "embedserve.cli", "scheduler", "--model",
                             str(tiny_bert_dir), "--cache-dir", str(tmp_path), "--calibrate-only",
                             "--dtype", "float32"],   # the dtype SchedulerProcess starts in
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr
    directory = tmp_path / "calibration" / result.stdout.strip().rsplit("/", 1)[-1]
    assert result.stdout.strip() == str(directory)
    baked = calibration.load_calibration(directory)
    assert baked is not None and baked.sample_size == 2 * len(CALIBRATION_TEXTS)
    before = _digests(directory)
    process = SchedulerProcess(tiny_bert_dir, "--cache-dir", str(tmp_path), threads=1)
    try:
        with grpc.insecure_channel(process.address) as channel:
            stub = inference_pb2_grpc.InferenceStub(channel)
            info = stub.Info(inference_pb2.InfoRequest())
            ranges = stub.Ranges(inference_pb2.RangesRequest(dimensions=16, normalize=True))
    finally:
        process.stop()
    assert info.calibration_id == baked.calibration_id
    assert wire.tensor_to_array(ranges.ranges).tobytes() == baked.ranges(16, True).tobytes()
    after = _digests(directory)
    assert {k: v for k, v in after.items() if k in before} == before
