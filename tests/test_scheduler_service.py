"""The Inference service end to end: real grpc server on 127.0.0.1, real client, real models.

Results through gRPC are compared with direct ``Engine.step`` on the same
sequences (the engine is tested against transformers in its own tier).
"""

from __future__ import annotations

import grpc
import numpy as np
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import ProtoReflectionDescriptorDatabase

from embedserve import ragged
from embedserve.engine import Batch, Engine
from embedserve.link import wire
from embedserve.model.postprocess import postprocess_embeddings, sigmoid
from embedserve.protos import inference_pb2
from embedserve.scheduler.settings import SchedulerSettings
from scheduler_harness import ThreadedScheduler, embed_request, random_sequences


@pytest.fixture(scope="module")
def bert_server(bert_engine, tiny_bert_dir):
    settings = SchedulerSettings(model_dir=tiny_bert_dir, max_batch_tokens=512,
                                 max_batch_sequences=64, metrics_port=0)
    with ThreadedScheduler(settings, bert_engine) as server:
        yield server


def direct(engine, sequences, task="embed", token_type_ids=None) -> np.ndarray:
    batch = Batch.from_sequences(sequences, task)
    if token_type_ids is not None:
        batch = Batch.from_lengths(batch.token_ids, batch.lengths, task,
                                   np.concatenate(token_type_ids))
    return engine.step(batch).wait()


def test_embed_equals_engine_step(bert_server, bert_engine):
    rng = np.random.default_rng(1)
    sequences = random_sequences(rng, 5, 1, 300)
    response = bert_server.stub.Embed(embed_request(sequences, request_id="r-1"), timeout=30)
    got = wire.tensor_to_array(response.embeddings)
    assert got.dtype == np.float32 and got.shape == (5, bert_engine.info.dimension)
    np.testing.assert_allclose(got, direct(bert_engine, sequences), rtol=1e-5, atol=1e-6)
    assert response.request_id == "r-1"
    t = response.timings
    assert t.total_us >= t.queue_us and t.total_us >= t.compute_us > 0


def test_normalize_dimensions_and_float16(bert_server, bert_engine):
    rng = np.random.default_rng(2)
    sequences = random_sequences(rng, 3, 2, 40)
    raw = direct(bert_engine, sequences)
    response = bert_server.stub.Embed(embed_request(
        sequences, normalize=True, dimensions=16, dtype=inference_pb2.DTYPE_FLOAT16), timeout=30)
    got = wire.tensor_to_array(response.embeddings)
    assert got.dtype == np.float16 and got.shape == (3, 16)
    expected = postprocess_embeddings(raw, True, 16)
    np.testing.assert_allclose(got.astype(np.float32), expected, rtol=2e-3, atol=2e-3)
    np.testing.assert_allclose(np.linalg.norm(got.astype(np.float32), axis=1), 1.0, atol=2e-3)


def test_200_concurrent_calls_each_get_their_own_rows(bert_server, bert_engine):
    rng = np.random.default_rng(3)
    calls = [random_sequences(rng, int(rng.integers(1, 4)), 1, 200) for _ in range(200)]
    futures = [bert_server.stub.Embed.future(embed_request(seqs, request_id=str(i)), timeout=60)
               for i, seqs in enumerate(calls)]
    flat = [s for seqs in calls for s in seqs]
    reference = np.concatenate([direct(bert_engine, flat[i:i + 64]) for i in range(0, len(flat), 64)])
    row = 0
    for i, (seqs, future) in enumerate(zip(calls, futures)):
        response = future.result()
        assert response.request_id == str(i)
        got = wire.tensor_to_array(response.embeddings)
        np.testing.assert_allclose(got, reference[row:row + len(seqs)], rtol=1e-5, atol=1e-6)
        row += len(seqs)
    batches = bert_server.counter("embedserve_scheduler_batch_sequences_count")
    assert batches < 200  # calls were batched together, not run one by one


def _status(call) -> grpc.StatusCode:
    with pytest.raises(grpc.RpcError) as info:
        call()
    return info.value.code()


def _raw_embed(ids: bytes, lengths: bytes, types: bytes = b"", **options) -> inference_pb2.EmbedRequest:
    return inference_pb2.EmbedRequest(tokens=inference_pb2.PackedTokens(
        token_ids=ids, lengths=lengths, token_type_ids=types), **options)


def _i32(*values: int) -> bytes:
    return np.array(values, dtype="<i4").tobytes()


@pytest.mark.parametrize("request_, detail", [
    (_raw_embed(b"", b""), "no sequences"),
    (_raw_embed(_i32(5, 6) + b"\x01", _i32(2)), "whole number"),
    (_raw_embed(_i32(5, 6), _i32(3)), "add up to 3"),
    (_raw_embed(_i32(5, 6), _i32(2, 0)), "needs at least one"),
    (_raw_embed(_i32(5, 250_002), _i32(2)), "outside the vocabulary"),
    (_raw_embed(_i32(5, -1), _i32(2)), "outside the vocabulary"),
    (_raw_embed(_i32(*([5] * 513)), _i32(513)), "at most 512"),
    (_raw_embed(_i32(5, 6), _i32(2), _i32(0, 2)), "token_type_ids"),
    (_raw_embed(_i32(5, 6), _i32(2), dimensions=33), "dimensions"),
    (_raw_embed(_i32(5, 6), _i32(2), dtype=9), "dtype"),
])
def test_invalid_requests_are_invalid_argument_and_break_nothing(bert_server, request_, detail):
    with pytest.raises(grpc.RpcError) as info:
        bert_server.stub.Embed(request_, timeout=10)
    assert info.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert detail in info.value.details()
    ok = bert_server.stub.Embed(embed_request([[5, 6, 7]]), timeout=10)
    assert list(ok.embeddings.shape) == [1, 32]


def test_score_on_an_embedding_model_is_invalid_argument(bert_server):
    request = inference_pb2.ScoreRequest(pairs=wire.pack_tokens(ragged.from_sequences([[0, 5, 2]])))
    assert _status(lambda: bert_server.stub.Score(request, timeout=10)) is grpc.StatusCode.INVALID_ARGUMENT


def test_info_reports_model_and_limits(bert_server, bert_engine):
    info = bert_server.stub.Info(inference_pb2.InfoRequest(), timeout=10)
    assert (info.model_id, info.dimension, info.max_positions) == (
        bert_engine.info.model_id, 32, 512)
    assert (info.max_batch_tokens, info.max_batch_sequences, info.max_queue_tokens) == (512, 64, 65536)
    assert list(info.tasks) == ["embed"] and info.device == "cpu" and info.dtype == "float32"
    assert info.version


def test_health_is_serving_and_reflection_lists_the_services(bert_server):
    health = health_pb2_grpc.HealthStub(bert_server.channel)
    for service in ("", "embedserve.v1.Inference"):
        reply = health.Check(health_pb2.HealthCheckRequest(service=service), timeout=10)
        assert reply.status == health_pb2.HealthCheckResponse.SERVING
    database = ProtoReflectionDescriptorDatabase(bert_server.channel)
    services = set(database.get_services())
    assert {"embedserve.v1.Inference", "grpc.health.v1.Health"} <= services
    from google.protobuf.descriptor_pool import DescriptorPool

    pool = DescriptorPool(database)
    methods = pool.FindServiceByName("embedserve.v1.Inference").methods_by_name
    assert methods["Embed"].input_type.fields_by_name["tokens"].message_type.name == "PackedTokens"


def test_metrics_endpoint_serves_scheduler_and_engine_metrics(bert_server):
    import urllib.request

    bert_server.stub.Embed(embed_request([[5, 6, 7]]), timeout=10)
    url = f"http://127.0.0.1:{bert_server.server.metrics_port}/metrics"
    text = urllib.request.urlopen(url, timeout=10).read().decode()
    for name in ("embedserve_scheduler_queue_tokens", "embedserve_scheduler_batch_tokens_bucket",
                 "embedserve_scheduler_step_seconds_count", "embedserve_engine_steps",
                 'embedserve_scheduler_calls_total{code="OK",method="Embed"}'):
        assert name in text, name


@pytest.fixture(scope="module")
def reranker(tiny_bert_reranker_dir):
    engine = Engine.load(tiny_bert_reranker_dir)
    settings = SchedulerSettings(model_dir=tiny_bert_reranker_dir, max_batch_tokens=256)
    with ThreadedScheduler(settings, engine) as server:
        yield server, engine
    engine.close()


def test_score_pairs_with_segment_ids_equal_engine_step(reranker):
    server, engine = reranker
    rng = np.random.default_rng(4)
    pairs, types = [], []
    for _ in range(6):  # [CLS] query [SEP] document [SEP], segment 0 then 1
        q, d = rng.integers(5, 1000, int(rng.integers(1, 20))), rng.integers(5, 1000, int(rng.integers(1, 60)))
        pairs.append(np.concatenate([[101], q, [102], d, [102]]).astype(np.int32))
        types.append(np.concatenate([np.zeros(len(q) + 2), np.ones(len(d) + 1)]).astype(np.int32))
    expected = direct(engine, pairs, "score", types)
    packed = wire.pack_tokens(ragged.from_lengths(np.concatenate(pairs), np.array([len(p) for p in pairs]),
                                                  np.concatenate(types)))
    for apply_sigmoid in (False, True):
        response = server.stub.Score(inference_pb2.ScoreRequest(pairs=packed, sigmoid=apply_sigmoid),
                                     timeout=30)
        got = wire.tensor_to_array(response.scores)
        assert got.dtype == np.float32 and got.shape == (6,)
        want = sigmoid(expected) if apply_sigmoid else expected
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    # segment ids matter: without them the scores differ
    no_types = wire.pack_tokens(ragged.from_sequences(pairs))
    plain = wire.tensor_to_array(server.stub.Score(inference_pb2.ScoreRequest(pairs=no_types)).scores)
    assert not np.allclose(plain, expected)
    embed = embed_request([[5, 6]])
    assert _status(lambda: server.stub.Embed(embed, timeout=10)) is grpc.StatusCode.INVALID_ARGUMENT


@pytest.mark.parametrize("dtype,budget", [("float32", 512), ("bfloat16", 1024)])
def test_without_a_budget_the_server_takes_its_engines_dtype_default(tiny_bert_dir, dtype, budget):
    with Engine.load(tiny_bert_dir, dtype=dtype) as engine:
        with ThreadedScheduler(SchedulerSettings(model_dir=tiny_bert_dir), engine) as server:
            info = server.stub.Info(inference_pb2.InfoRequest(), timeout=30)
    assert info.max_batch_tokens == budget


def test_default_model_through_grpc_equals_engine_step(default_model_dir):
    """multilingual-e5-small: concurrent mixed-length calls, each equal to a direct step."""
    engine = Engine.load(default_model_dir)
    try:
        rng = np.random.default_rng(5)
        calls = [random_sequences(rng, int(rng.integers(1, 3)), 2, 48) for _ in range(6)]
        settings = SchedulerSettings(model_dir=default_model_dir, max_batch_tokens=256)
        with ThreadedScheduler(settings, engine) as server:
            futures = [server.stub.Embed.future(embed_request(seqs, normalize=True), timeout=120)
                       for seqs in calls]
            results = [wire.tensor_to_array(f.result().embeddings) for f in futures]
        reference = direct(engine, [s for seqs in calls for s in seqs])
        expected = postprocess_embeddings(reference, True, None)
        row = 0
        for seqs, got in zip(calls, results):
            assert got.shape == (len(seqs), 384)
            np.testing.assert_allclose(got, expected[row:row + len(seqs)], rtol=1e-4, atol=1e-5)
            row += len(seqs)
    finally:
        engine.close()
