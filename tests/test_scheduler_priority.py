"""Priority classes through a real replica (docs/priority.md): what each step holds.

A real tiny BERT behind ``RecordingEngine`` (gated, so calls stay queued while the
test sends more), called over gRPC with in-flight depth 2. Sequences carry marker
ids, so the record shows which call each stepped sequence came from.
"""

from __future__ import annotations

import pytest

from embedserve.protos import inference_pb2
from embedserve.scheduler.settings import SchedulerSettings
from scheduler_harness import RecordingEngine, ThreadedScheduler, embed_request, wait_until

BATCH = inference_pb2.PRIORITY_BATCH


def marked(marker: int, count: int, length: int = 5) -> list[list[int]]:
    return [[marker] * length for _ in range(count)]


def markers(batch) -> list[int]:
    """The marker of each sequence of a stepped batch, in order."""
    cu = batch.cu_seqlens
    return [int(batch.token_ids[cu[i] + 1]) for i in range(batch.num_sequences)]


@pytest.fixture
def replica(bert_engine, tiny_bert_dir, request):
    recorder = RecordingEngine(bert_engine)
    settings = SchedulerSettings(model_dir=tiny_bert_dir, max_batch_tokens=64, in_flight_depth=2,
                                 max_queue_tokens=600, batch_tokens_while_interactive=8,
                                 interactive_window_s=request.param)
    with ThreadedScheduler(settings, recorder) as server:
        yield server, recorder
        recorder.gate.set()
    recorder.close()


def step_into_engine(server, recorder, sequences, **options):
    """Send one call and wait until a step holding it is in the (gated) engine."""
    steps = recorder.steps
    future = server.stub.Embed.future(embed_request(sequences, **options), timeout=60)
    wait_until(lambda: recorder.steps == steps + 1, what="a step in the engine")
    return future


@pytest.mark.parametrize("replica", [0.0], indirect=True)
def test_an_interactive_call_overtakes_queued_batch_work_which_then_runs_at_full_size(replica):
    server, recorder = replica
    recorder.gate.clear()
    first = recorder.steps     # the replica's own warm-up steps come before
    calls = [step_into_engine(server, recorder, marked(11, 1))]          # interactive, step 1
    calls.append(step_into_engine(server, recorder, marked(22, 15), priority=BATCH))  # step 2
    calls.append(server.stub.Embed.future(embed_request(marked(33, 12), priority=BATCH), timeout=60))
    wait_until(lambda: server.server.pool.queued_sequences == 15, what="the batch calls queued")
    calls.append(server.stub.Embed.future(embed_request(marked(44, 2)), timeout=60))
    wait_until(lambda: server.server.pool.queued_sequences == 17, what="the query queued")
    recorder.gate.set()
    for call in calls:
        call.result()
    steps = [markers(b) for b in recorder.batches[first:]]
    # Step 2 ran batch work at the full 64-token budget (no interactive call queued or
    # recent: the window is 0); step 3 the query first, then one batch sequence (the
    # 8-token bound leaves no room for a second 5-token one), before the batch call
    # queued ahead of the query; then the full budget again, FCFS.
    assert steps[1] == [22] * 12
    assert steps[2] == [44, 44, 22]
    assert steps[3] == [22, 22] + [33] * 10
    assert steps[4:] == [[33, 33]]


@pytest.mark.parametrize("replica", [60.0], indirect=True)
def test_after_an_interactive_call_batch_steps_are_bounded_and_not_stacked_in_the_engine(replica):
    server, recorder = replica
    recorder.gate.clear()
    first = recorder.steps     # the replica's own warm-up steps come before
    calls = [step_into_engine(server, recorder, marked(11, 1))]          # interactive, step 1
    calls.append(server.stub.Embed.future(embed_request(marked(22, 6), priority=BATCH), timeout=60))
    wait_until(lambda: server.server.pool.queued_sequences == 6, what="the batch call queued")
    # An interactive call arrived within the window and one step is in the engine: the
    # batch step waits to be formed, so the next query does not wait behind two steps.
    assert recorder.steps == first + 1
    calls.append(server.stub.Embed.future(embed_request(marked(44, 1)), timeout=60))
    wait_until(lambda: recorder.steps == first + 2, what="the query's step")
    assert markers(recorder.batches[first + 1]) == [44, 22]
    recorder.gate.set()
    for call in calls:
        call.result()
    # Within the window every later step carries one bounded batch sequence.
    assert [markers(b) for b in recorder.batches[first + 2:]] == [[22]] * 5
