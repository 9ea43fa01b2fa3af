"""The ``priority`` body field on every route that computes (docs/priority.md), and the
class reaching the replica on each RPC: TEI's ``/embed_sparse``, ``/predict``, ``POST /``
and ``/similarity``, vLLM's ``/classify``, Cohere's ``/v2/embed`` and ``/v2/rerank``
(the routes of tests/test_gateway_priority.py are checked there).

Real replicas (the session's tiny BERT embedder and cross-encoder; a tiny BERT classifier
and SPLADE model of this module's own), each behind an in-process gateway; the class a
call ran in is read from the gateway's and the replica's Prometheus metrics, as deltas.
A batch-class body on ``/predict`` and ``/classify`` reaches the replica's Classify RPC as
batch, on ``/embed_sparse`` its EmbedSparse RPC.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import httpx
import pytest

from gateway_harness import SchedulerProcess, gateway_in_front_of, metric_value
from task_models import build_classifier, build_splade

CLASSES = ("interactive", "batch")
LABELS = ["negative", "positive"]


@pytest.fixture(scope="module")
def classifier_replica(tmp_path_factory, minilm_dir) -> Iterator[SchedulerProcess]:
    directory = build_classifier(tmp_path_factory.mktemp("priority_classifier"), "BertForSequenceClassification",
                                 LABELS, "single_label_classification", minilm_dir, seed=1)
    replica = SchedulerProcess(directory, threads=1)
    try:
        yield replica
    finally:
        replica.stop()


@pytest.fixture(scope="module")
def splade_replica(tmp_path_factory, minilm_dir) -> Iterator[SchedulerProcess]:
    replica = SchedulerProcess(build_splade(tmp_path_factory.mktemp("priority_splade"), minilm_dir, seed=2),
                               threads=1)
    try:
        yield replica
    finally:
        replica.stop()


@pytest.fixture(scope="module")
def stacks(tiny_bert_replica, tiny_reranker_replica, classifier_replica, splade_replica):
    """Per task: (gateway, replica)."""
    replicas = {"embed": tiny_bert_replica, "score": tiny_reranker_replica,
                "classify": classifier_replica, "sparse": splade_replica}
    with gateway_in_front_of(tiny_bert_replica) as embed, gateway_in_front_of(tiny_reranker_replica) as score, \
            gateway_in_front_of(classifier_replica) as classify, gateway_in_front_of(splade_replica) as sparse:
        gateways = {"embed": embed, "score": score, "classify": classify, "sparse": sparse}
        yield {task: (gateways[task], replicas[task]) for task in gateways}


def class_counts(server, replica) -> dict[str, tuple[float, float]]:
    """Per class: (gateway requests, replica calls) answered so far."""
    text = httpx.get(server.url + "/metrics", timeout=30).text
    return {c: (metric_value(text, "embedserve_gateway_class_request_seconds_count", priority=c),
                replica.metric("embedserve_scheduler_class_call_seconds_count", priority=c))
            for c in CLASSES}


def ran_in(stack, send: Callable[[httpx.Client], httpx.Response]) -> str:
    """The one class the request ``send(client)`` ran in, at the gateway and the replica."""
    server, replica = stack
    before = class_counts(server, replica)
    with server.client() as client:
        reply = send(client)
    assert reply.status_code == 200, reply.text
    after = class_counts(server, replica)
    grew = [c for c in CLASSES if after[c] != before[c]]
    assert len(grew) == 1, (before, after)
    assert after[grew[0]][0] - before[grew[0]][0] == 1      # one gateway request
    assert after[grew[0]][1] - before[grew[0]][1] >= 1      # and its replica call(s)
    return grew[0]


# (task, route, body without priority): each computes on the task's replica.
ROUTES = [
    ("sparse", "/embed_sparse", {"inputs": ["a sparse text", "another"]}),
    ("classify", "/predict", {"inputs": ["a text to classify", "another"]}),
    ("classify", "/classify", {"input": ["a text to classify", "another"]}),
    ("classify", "/", {"inputs": "a text to classify"}),
    ("embed", "/", {"inputs": ["a text to embed"]}),
    ("score", "/", {"query": "a query", "texts": ["a document", "another"]}),
    ("embed", "/similarity", {"inputs": {"source_sentence": "a", "sentences": ["b", "c"]}}),
    ("score", "/similarity", {"inputs": {"source_sentence": "a", "sentences": ["b", "c"]}}),
    ("embed", "/v2/embed", {"texts": ["a text to embed"], "input_type": "search_document"}),
    ("score", "/v2/rerank", {"query": "a query", "documents": ["a document", "another"]}),
]
IDS = [f"{route}-{task}" for task, route, _ in ROUTES]


@pytest.mark.parametrize("task, route, body", ROUTES, ids=IDS)
def test_the_body_field_runs_the_call_in_its_class_up_to_the_replica(stacks, task, route, body):
    stack = stacks[task]
    assert ran_in(stack, lambda c: c.post(route, json={**body, "priority": "batch"})) == "batch"
    # The body wins over the header, as on /v1/embeddings.
    assert ran_in(stack, lambda c: c.post(route, json={**body, "priority": "interactive"},
                                          headers={"x-embedserve-priority": "batch"})) == "interactive"


@pytest.mark.parametrize("task, route, body", ROUTES, ids=IDS)
def test_an_unknown_class_in_the_body_is_a_400_naming_priority(stacks, task, route, body):
    server, _ = stacks[task]
    with server.client() as client:
        reply = client.post(route, json={**body, "priority": "urgent"})
    assert reply.status_code == 400, reply.text
    assert "priority" in reply.text and "interactive, batch" in reply.text


@pytest.mark.parametrize("route, body", [("/v2/embed", {"texts": ["x"], "input_type": "search_query"}),
                                         ("/v2/rerank", {"query": "q", "documents": ["d"]})])
def test_cohere_integer_priority_ranks_into_the_classes(stacks, route, body):
    """Cohere's SDK sends ``priority`` as an integer, 0 (its default) handled first: above 0
    is the batch class; 0 leaves the class to the header; below 0 is a 400."""
    stack = stacks["embed" if route == "/v2/embed" else "score"]
    assert ran_in(stack, lambda c: c.post(route, json={**body, "priority": 5})) == "batch"
    assert ran_in(stack, lambda c: c.post(route, json={**body, "priority": 0})) == "interactive"
    assert ran_in(stack, lambda c: c.post(route, json={**body, "priority": 0},
                                          headers={"x-embedserve-priority": "batch"})) == "batch"
    server, _ = stack
    with server.client() as client:
        reply = client.post(route, json={**body, "priority": -1})
    assert reply.status_code == 400 and "priority" in reply.text, reply.text
