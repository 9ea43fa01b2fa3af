"""Preempting a CPU step between layers (engine/runners/preemption.py): an urgent step
submitted while a long step is being computed finishes before it, and neither step's
result changes.

A real tiny BERT (two layers), on one lane (``cpu_lanes=1``: with more, an urgent step
runs beside the others instead, tests/test_engine_lanes.py). The long step is held at its
first layer by a hook of the test's own (registered ahead of the runner's), so the urgent
step is submitted while that step is mid-computation; the order is read at the long
step's last layer, not timed.
"""

from __future__ import annotations

import threading

import numpy as np
import pytest

from embedserve.engine.batch import Batch

GATE_TIMEOUT_S = 30.0
LONG_TOKENS = 300


@pytest.fixture(scope="module")
def bert_engine(tiny_bert_dir):
    """tiny_bert_dir's engine on one lane: urgent steps run at layer boundaries."""
    from embedserve.engine import Engine

    with Engine.load(tiny_bert_dir, cpu_lanes=1) as engine:
        yield engine


def layers_of(engine):
    return list(engine.model.encoder.layers)


def sequences(rng: np.random.Generator, count: int, length: int) -> list[list[int]]:
    return [rng.integers(5, 1000, length).tolist() for _ in range(count)]


@pytest.fixture
def held_long_step(bert_engine):
    """Hooks: once ``armed``, the first layer of the next long step waits for ``release``; its last layer
    records whether the urgent step had finished (``seen``)."""
    state = {"armed": False, "entered": threading.Event(), "release": threading.Event(),
             "urgent": None, "seen": []}
    layers = layers_of(bert_engine)
    assert len(layers) >= 2

    def first(_module, args):
        if args[0].shape[0] >= LONG_TOKENS and state["armed"]:
            state["armed"] = False
            state["entered"].set()
            assert state["release"].wait(GATE_TIMEOUT_S), "the test never released the long step"

    def last(_module, args):
        if args[0].shape[0] >= LONG_TOKENS and state["urgent"] is not None:
            state["seen"].append(state["urgent"].ready())

    handles = [layers[0].register_forward_pre_hook(first, prepend=True),
               layers[-1].register_forward_pre_hook(last, prepend=True)]
    yield state
    state["release"].set()
    for handle in handles:
        handle.remove()


def test_cpu_engine_preempts(bert_engine):
    assert bert_engine.preempts_steps


@pytest.mark.parametrize("inline", [False, True])
def test_an_urgent_step_runs_between_the_layers_of_the_step_being_computed(bert_engine, held_long_step,
                                                                         inline):
    rng = np.random.default_rng(0)
    long_batch = Batch.from_sequences(sequences(rng, 10, LONG_TOKENS // 10))
    urgent_batch = Batch.from_sequences(sequences(rng, 2, 7))
    alone_long = bert_engine.step(long_batch).wait()
    alone_urgent = bert_engine.step(urgent_batch).wait()
    preempted_before = bert_engine.stats()["preempted_steps"]

    held_long_step["armed"] = True
    result: dict[str, np.ndarray] = {}
    # Inline: the long step is computed on a thread of the test's (as a replica's loop
    # computes frames' steps), and the urgent one is handed over from this one.
    worker = threading.Thread(target=lambda: result.update(
        long=bert_engine.step(long_batch, inline=True).wait())) if inline else None
    if worker is not None:
        worker.start()
    else:
        long_lazy = bert_engine.step(long_batch)
    assert held_long_step["entered"].wait(GATE_TIMEOUT_S)
    urgent = bert_engine.step(urgent_batch, preempt=True)
    held_long_step["urgent"] = urgent
    held_long_step["release"].set()
    urgent_rows = urgent.wait(GATE_TIMEOUT_S)
    if worker is not None:
        worker.join(GATE_TIMEOUT_S)
        long_rows = result["long"]
    else:
        long_rows = long_lazy.wait(GATE_TIMEOUT_S)

    # The urgent step had finished when the long step reached its last layer.
    assert held_long_step["seen"] == [True]
    assert bert_engine.stats()["preempted_steps"] == preempted_before + 1
    # Each computes exactly what it computes alone (the long step's activations were kept).
    np.testing.assert_array_equal(urgent_rows, alone_urgent)
    np.testing.assert_array_equal(long_rows, alone_long)


def test_an_urgent_step_with_no_step_running_runs_on_its_own(bert_engine):
    rng = np.random.default_rng(1)
    batch = Batch.from_sequences(sequences(rng, 3, 9))
    np.testing.assert_array_equal(bert_engine.step(batch, preempt=True).wait(GATE_TIMEOUT_S),
                                  bert_engine.step(batch).wait())


def test_a_failing_urgent_step_fails_alone(bert_engine, held_long_step):
    rng = np.random.default_rng(2)
    long_batch = Batch.from_sequences(sequences(rng, 10, LONG_TOKENS // 10))
    alone_long = bert_engine.step(long_batch).wait()
    held_long_step["armed"] = True
    long_lazy = bert_engine.step(long_batch)
    assert held_long_step["entered"].wait(GATE_TIMEOUT_S)
    bad = bert_engine.step(Batch.from_sequences([[5, 10**9, 6]]), preempt=True)   # id out of range
    held_long_step["release"].set()
    with pytest.raises(Exception, match="token id|vocab|range|index"):
        bad.wait(GATE_TIMEOUT_S)
    np.testing.assert_array_equal(long_lazy.wait(GATE_TIMEOUT_S), alone_long)


def test_an_urgent_step_is_counted_before_its_answer_is_out():
    # Whoever holds an urgent step's answer reads it counted: a client that read the stats
    # right after its reply once saw 0 under load (the count came after the answer). A
    # future's callbacks run as it resolves, so they see what a client could see first.
    import torch
    from torch import nn

    from embedserve.engine.runners.preemption import LayerPreemption

    model = nn.Module()
    model.layers = nn.ModuleList([nn.Identity(), nn.Identity()])
    preemption = LayerPreemption(lambda batch: np.zeros((batch.num_sequences, 4), np.float32))
    assert preemption.install(model) == 2
    seen: list[int] = []
    at_a_layer = preemption.push(Batch.from_sequences([[5, 6]]))
    at_a_layer.add_done_callback(lambda _f: seen.append(preemption.preempted))
    model.layers[0](torch.zeros(1))   # a layer boundary of the step being computed
    assert at_a_layer.result(0).shape == (1, 4) and seen == [1]

    counted: list[int] = []
    own_job = preemption.push(Batch.from_sequences([[7]]))
    own_job.add_done_callback(lambda _f: seen.append(len(counted)))
    assert preemption.run_pending(lambda: counted.append(1)) == 1
    assert seen == [1, 1] and preemption.preempted == 1
