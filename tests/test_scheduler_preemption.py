"""Interactive steps preempt batch steps through a real replica (docs/priority.md).

A real tiny BERT (two layers) on the CPU engine, called over gRPC, on one lane
(``cpu_lanes=1``; with two, the interactive call is answered while the batch step is still
held: tests/test_engine_lanes.py and the last test here). A long batch call's
step is held at its first layer by a hook of the test's own, an interactive call is
sent meanwhile, and the batch step's last layer waits for the interactive answer: the
interactive call finishes first, with the rows it gets alone, and so does the batch
call. Order of completion, never timing (the waits only keep a broken build from
hanging).
"""

from __future__ import annotations

import threading

import numpy as np
import pytest

from embedserve.link import wire
from embedserve.protos import inference_pb2
from embedserve.scheduler.settings import SchedulerSettings
from scheduler_harness import ThreadedScheduler, embed_request, wait_until

BATCH = inference_pb2.PRIORITY_BATCH
GATE_TIMEOUT_S = 30.0
LONG_TOKENS = 300


@pytest.fixture(scope="module")
def bert_engine(tiny_bert_dir):
    """tiny_bert_dir's engine on one lane: interactive steps run at layer boundaries."""
    from embedserve.engine import Engine

    with Engine.load(tiny_bert_dir, cpu_lanes=1) as engine:
        yield engine


@pytest.fixture(scope="module")
def lanes_engine(tiny_bert_dir):
    """tiny_bert_dir's engine on two lanes: interactive steps start beside the batch steps."""
    from embedserve.engine import Engine

    with Engine.load(tiny_bert_dir, cpu_lanes=2) as engine:
        yield engine


def rows(reply) -> np.ndarray:
    return wire.tensor_to_array(reply.embeddings)


@pytest.fixture
def replica(bert_engine, tiny_bert_dir, request):
    settings = SchedulerSettings(model_dir=tiny_bert_dir, max_batch_tokens=512, in_flight_depth=2,
                                 max_queue_tokens=2048, preempt_batch_steps=request.param)
    with ThreadedScheduler(settings, bert_engine) as server:
        yield server


@pytest.fixture
def held_long_step(bert_engine):
    """Once ``armed``: the next long step waits at its first layer for ``release``, and at
    its last layer for ``answered`` (recording whether that came, in ``seen``)."""
    state = {"armed": False, "entered": threading.Event(), "release": threading.Event(),
             "answered": threading.Event(), "seen": []}
    layers = list(bert_engine.model.encoder.layers)

    def first(_module, args):
        if args[0].shape[0] >= LONG_TOKENS and state["armed"]:
            state["armed"] = False
            state["entered"].set()
            state["release"].wait(GATE_TIMEOUT_S)

    def last(_module, args):
        if args[0].shape[0] >= LONG_TOKENS and state["entered"].is_set() and not state["seen"]:
            state["seen"].append(state["answered"].wait(GATE_TIMEOUT_S))

    handles = [layers[0].register_forward_pre_hook(first, prepend=True),
               layers[-1].register_forward_pre_hook(last, prepend=True)]
    yield state
    state["release"].set()
    state["answered"].set()
    for handle in handles:
        handle.remove()


@pytest.mark.parametrize("replica", [True], indirect=True)
def test_an_interactive_call_sent_during_a_batch_step_finishes_before_it(replica, held_long_step):
    server = replica
    assert server.server.batcher.preempts
    rng = np.random.default_rng(0)
    long_call = [rng.integers(5, 1000, LONG_TOKENS // 10).tolist() for _ in range(10)]
    query = [rng.integers(5, 1000, 6).tolist() for _ in range(2)]
    preempted_before = server.server.engine.stats()["preempted_steps"]

    finished: list[str] = []
    held_long_step["armed"] = True
    bulk = server.stub.Embed.future(embed_request(long_call, priority=BATCH), timeout=60)
    bulk.add_done_callback(lambda _f: finished.append("batch"))
    assert held_long_step["entered"].wait(GATE_TIMEOUT_S), "the batch step never started"
    interactive = server.stub.Embed.future(embed_request(query), timeout=60)
    interactive.add_done_callback(lambda _f: (finished.append("interactive"),
                                              held_long_step["answered"].set()))
    # The interactive step is in the engine beside the held batch step.
    wait_until(lambda: server.server.batcher.in_flight == 2, what="the interactive step submitted")
    held_long_step["release"].set()
    interactive_rows, bulk_rows = rows(interactive.result()), rows(bulk.result())

    assert held_long_step["seen"] == [True]   # answered before the batch step's last layer
    assert finished == ["interactive", "batch"]
    assert server.server.engine.stats()["preempted_steps"] == preempted_before + 1
    # Each call gets exactly the rows it gets alone.
    np.testing.assert_array_equal(interactive_rows, rows(server.stub.Embed(embed_request(query), timeout=60)))
    np.testing.assert_array_equal(bulk_rows, rows(server.stub.Embed(embed_request(long_call, priority=BATCH),
                                                                    timeout=60)))


@pytest.mark.parametrize("replica", [False], indirect=True)
def test_without_preemption_the_classes_share_steps(replica):
    server = replica
    assert not server.server.batcher.preempts
    reply = server.stub.Embed(embed_request([[5, 6, 7]], priority=BATCH), timeout=60)
    assert rows(reply).shape == (1, 32)


def test_with_lanes_an_interactive_call_is_answered_while_the_batch_step_is_held(lanes_engine, tiny_bert_dir):
    settings = SchedulerSettings(model_dir=tiny_bert_dir, max_batch_tokens=512, in_flight_depth=2,
                                 max_queue_tokens=2048)
    layers = list(lanes_engine.model.encoder.layers)
    entered, release = threading.Event(), threading.Event()

    def first(_module, args):
        if args[0].shape[0] >= LONG_TOKENS and not entered.is_set():
            entered.set()
            release.wait(GATE_TIMEOUT_S)

    handle = layers[0].register_forward_pre_hook(first, prepend=True)
    try:
        with ThreadedScheduler(settings, lanes_engine) as server:
            assert server.server.batcher.preempts
            rng = np.random.default_rng(3)
            long_call = [rng.integers(5, 1000, LONG_TOKENS // 10).tolist() for _ in range(10)]
            query = [rng.integers(5, 1000, 6).tolist() for _ in range(2)]
            preempted_before = lanes_engine.stats()["preempted_steps"]
            bulk = server.stub.Embed.future(embed_request(long_call, priority=BATCH), timeout=60)
            assert entered.wait(GATE_TIMEOUT_S), "the batch step never started"
            interactive_rows = rows(server.stub.Embed(embed_request(query), timeout=60))
            assert not bulk.done()   # answered while the batch step waits at its first layer
            release.set()
            bulk_rows = rows(bulk.result())
            assert lanes_engine.stats()["preempted_steps"] == preempted_before + 1
            np.testing.assert_array_equal(interactive_rows, rows(server.stub.Embed(embed_request(query), timeout=60)))
            np.testing.assert_array_equal(bulk_rows, rows(server.stub.Embed(
                embed_request(long_call, priority=BATCH), timeout=60)))
    finally:
        release.set()
        handle.remove()
