"""Priority classes end to end (docs/priority.md): how a request names its class, how an
operator forces one, that the class reaches the replica, and each class's own budget.

A real replica (the session's tiny BERT one) behind an in-process gateway; the class a
call ran in is read from both processes' Prometheus metrics, as deltas (the replica is
shared with other tests).
"""

from __future__ import annotations

import grpc
import numpy as np
import pytest

from embedserve.bulk.remote import RemoteEmbedder
from embedserve.local.options import EmbedOptions
from embedserve.protos import inference_pb2, inference_pb2_grpc
from gateway_harness import gateway_in_front_of, metric_value

USER_KEY = "user-key"
BULK_KEY = "bulk-key"
CLASSES = ("interactive", "batch")


@pytest.fixture(scope="module")
def stack(tiny_bert_replica):
    with gateway_in_front_of(tiny_bert_replica, api_key=USER_KEY, batch_api_keys=(BULK_KEY,),
                             route_priorities={"/embed": "batch"}, max_inflight_tokens=4096) as server:
        yield server, tiny_bert_replica


def class_counts(server, replica) -> dict[str, tuple[float, float]]:
    """Per class: (gateway requests, replica calls) answered so far."""
    text = server.client().get("/metrics").text
    return {c: (metric_value(text, "embedserve_gateway_class_request_seconds_count", priority=c),
                replica.metric("embedserve_scheduler_class_call_seconds_count", priority=c))
            for c in CLASSES}


def ran_in(stack, send) -> tuple[str, object]:
    """The one class a request sent by ``send(client)`` ran in, at both ends; and its reply."""
    server, replica = stack
    before = class_counts(server, replica)
    with server.client(headers={"authorization": f"Bearer {USER_KEY}"}) as client:
        reply = send(client)
    assert reply.status_code == 200, reply.text
    after = class_counts(server, replica)
    grew = [c for c in CLASSES if after[c] != before[c]]
    assert len(grew) == 1, (before, after)
    gateway_delta, replica_delta = (a - b for a, b in zip(after[grew[0]], before[grew[0]]))
    assert (gateway_delta, replica_delta) == (1, 1)
    return grew[0], reply


def embeddings(body_extra: dict | None = None, headers: dict | None = None, key: str | None = None):
    def send(client):
        extra_headers = dict(headers or {})
        if key is not None:
            extra_headers["authorization"] = f"Bearer {key}"
        return client.post("/v1/embeddings", json={"input": ["hello world", "a second text"],
                                                   **(body_extra or {})}, headers=extra_headers)
    return send


@pytest.mark.parametrize("body, headers, key, expected", [
    ({}, {}, None, "interactive"),                                            # the default
    ({}, {"x-embedserve-priority": "batch"}, None, "batch"),                  # the header
    ({}, {"X-Embedserve-Priority": "Batch"}, None, "batch"),                  # any case
    ({"priority": "batch"}, {}, None, "batch"),                               # the body field
    ({"priority": "interactive"}, {"x-embedserve-priority": "batch"}, None, "interactive"),  # body wins
    ({"priority": "interactive"}, {}, BULK_KEY, "batch"),                     # a batch key forces it
])
def test_a_request_names_its_class_and_it_reaches_the_replica(stack, body, headers, key, expected):
    assert ran_in(stack, embeddings(body, headers, key))[0] == expected


def test_both_classes_answer_the_same_vectors(stack):
    _, interactive = ran_in(stack, embeddings())
    _, batch = ran_in(stack, embeddings({"priority": "batch"}))
    vectors = [np.array([d["embedding"] for d in r.json()["data"]]) for r in (interactive, batch)]
    np.testing.assert_array_equal(vectors[0], vectors[1])


def test_a_forced_route_runs_in_its_class_whatever_the_request_asks(stack):
    def send(client):
        return client.post("/embed", json={"inputs": "hello", "priority": "interactive"})
    assert ran_in(stack, send)[0] == "batch"


def test_a_batch_key_is_accepted_beside_the_api_key_and_others_are_refused(stack):
    server, _ = stack
    with server.client() as client:
        assert client.post("/v1/embeddings", json={"input": "x"},
                           headers={"authorization": f"Bearer {BULK_KEY}"}).status_code == 200
        assert client.post("/v1/embeddings", json={"input": "x"},
                           headers={"authorization": "Bearer other"}).status_code == 401


@pytest.mark.parametrize("body, headers, status, field", [
    ({"priority": "urgent"}, {}, 400, "priority"),
    ({}, {"x-embedserve-priority": "urgent"}, 400, "x-embedserve-priority"),
    ({"priority": 1}, {}, 422, "priority"),
])
def test_an_unknown_class_is_a_clear_client_error(stack, body, headers, status, field):
    server, _ = stack
    with server.client(headers={"authorization": f"Bearer {USER_KEY}", **headers}) as client:
        reply = client.post("/v1/embeddings", json={"input": "x", **body})
    assert reply.status_code == status, reply.text
    assert field in reply.text


def test_a_full_batch_budget_never_refuses_an_interactive_request(stack):
    server, _ = stack
    gateway, _ = server.app.state.router.route(None, "embed")
    batch_budget = gateway.budgets["batch"]
    # Everything the batch class may hold is held (as by a bulk job in flight).
    with batch_budget.hold(batch_budget.capacity), \
            server.client(headers={"authorization": f"Bearer {USER_KEY}"}) as client:
        assert client.post("/v1/embeddings", json={"input": "a query"}).status_code == 200
        refused = client.post("/v1/embeddings", json={"input": "a document", "priority": "batch"})
    assert refused.status_code == 429 and "retry-after" in refused.headers


def test_embed_url_sends_its_documents_in_the_batch_class(stack, tiny_bert_dir):
    server, replica = stack
    before = class_counts(server, replica)
    embedder = RemoteEmbedder(server.url, tiny_bert_dir, EmbedOptions(), api_key=USER_KEY)
    part = embedder.compute(embedder.prepare(["one document", "another document", "a third"]))
    assert part.stored.shape[0] == 3
    after = class_counts(server, replica)
    assert after["batch"][0] > before["batch"][0] and after["batch"][1] > before["batch"][1]
    assert after["interactive"] == before["interactive"]


def test_a_replica_refuses_a_class_it_does_not_know(tiny_bert_replica):
    with grpc.insecure_channel(tiny_bert_replica.address) as channel:
        stub = inference_pb2_grpc.InferenceStub(channel)
        tokens = inference_pb2.PackedTokens(token_ids=np.array([0, 5, 2], "<i4").tobytes(),
                                            lengths=np.array([3], "<i4").tobytes())
        with pytest.raises(grpc.RpcError) as caught:
            stub.Embed(inference_pb2.EmbedRequest(tokens=tokens, priority=7), timeout=30)
        assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "Priority" in caught.value.details()
        answered = stub.Embed(inference_pb2.EmbedRequest(tokens=tokens,
                                                         priority=inference_pb2.PRIORITY_BATCH),
                              timeout=30)
        assert answered.embeddings.shape[0] == 1
