"""Every embedserve error, raised in a real replica, reaches the gateway as the same class
over gRPC and over frames (embedserve/link/status.py: one table, both directions).

A real replica (``ThreadedScheduler``, a tiny model; ``RecordingEngine`` fails its next
step with the error under test, so the error travels the replica's real path: batcher,
servicer, status table, transport). The gateway's side is its own code: ``Replica.call``
over a frame channel or a grpc.aio stub, then ``from_replica_error`` as the dispatcher
calls it. The expected HTTP statuses and gRPC codes are written out here, not read from
the tables under test.
"""

from __future__ import annotations

import asyncio
import tempfile
from pathlib import Path

import grpc
import pytest

from embedserve import errors
from embedserve.gateway.grpc_api_errors import api_status
from embedserve.gateway.http_errors import status_for
from embedserve.gateway.replicas import REPLICA_CALL_ERRORS, Replica
from embedserve.link.auth import call_metadata
from embedserve.link.frame_keeper import FrameKeeper
from embedserve.link.status import ERROR_TABLE, from_replica_error
from embedserve.protos import inference_pb2_grpc
from embedserve.scheduler.settings import SchedulerSettings
from scheduler_harness import RecordingEngine, ThreadedScheduler, embed_request

TOKEN = "link-errors-token"
C = grpc.StatusCode

# class raised in the replica -> (its code on the link, the class the gateway raises,
# the gateway's HTTP status, the gateway's public gRPC code)
EXPECTED = {
    errors.EmbedServeError: (C.INTERNAL, errors.EmbedServeError, 500, C.INTERNAL),
    errors.InvalidInput: (C.INVALID_ARGUMENT, errors.InvalidInput, 400, C.INVALID_ARGUMENT),
    errors.InputTooLong: (C.INVALID_ARGUMENT, errors.InputTooLong, 413, C.INVALID_ARGUMENT),
    errors.ModelNotFound: (C.NOT_FOUND, errors.ModelNotFound, 404, C.NOT_FOUND),
    errors.Overloaded: (C.RESOURCE_EXHAUSTED, errors.Overloaded, 429, C.RESOURCE_EXHAUSTED),
    errors.Unavailable: (C.UNAVAILABLE, errors.Unavailable, 503, C.UNAVAILABLE),
    errors.DeviceLost: (C.UNAVAILABLE, errors.DeviceLost, 503, C.UNAVAILABLE),
    errors.DeadlineExceeded: (C.DEADLINE_EXCEEDED, errors.DeadlineExceeded, 504, C.DEADLINE_EXCEEDED),
    # The replica's caller is the gateway, which has not left: a replica that cancels is
    # one that is stopping, so unavailable (never the 499 of a client that went away).
    errors.Cancelled: (C.CANCELLED, errors.Unavailable, 503, C.UNAVAILABLE),
    errors.ModelLoadError: (C.INTERNAL, errors.ModelLoadError, 503, C.INTERNAL),
}


def _instance(cls: type[errors.EmbedServeError]) -> errors.EmbedServeError:
    if cls is errors.InputTooLong:
        return errors.InputTooLong("input 0 has 9 tokens, over the limit of 8", index=0, length=9, limit=8)
    if cls is errors.ModelNotFound:
        return errors.ModelNotFound("no-such-model")
    return cls(f"a {cls.__name__} raised in the replica")


def test_the_table_covers_every_class_and_pins_its_numbers():
    assert set(ERROR_TABLE) == set(errors.ALL_ERRORS) == set(EXPECTED)
    # A frame REPLY names the class by number: fixed, distinct, never 0 (none).
    assert {cls.__name__: row.number for cls, row in ERROR_TABLE.items()} == {
        "EmbedServeError": 1, "InvalidInput": 2, "InputTooLong": 3, "ModelNotFound": 4,
        "Overloaded": 5, "Unavailable": 6, "DeviceLost": 7, "DeadlineExceeded": 8,
        "Cancelled": 9, "ModelLoadError": 10}


@pytest.fixture(scope="module")
def replica(bert_engine, tiny_bert_dir):
    engine = RecordingEngine(bert_engine)
    with tempfile.TemporaryDirectory(prefix="es-") as directory:   # short: sun_path is 108 bytes
        settings = SchedulerSettings(model_dir=tiny_bert_dir, unix_socket=Path(directory) / "r.sock",
                                     replica_token=TOKEN, max_batch_tokens=512)
        with ThreadedScheduler(settings, engine) as server:
            yield server, engine


def _seen_by_gateway(server: ThreadedScheduler, transport: str) -> BaseException:
    """One Embed through the gateway's ``Replica.call``; the error it raises."""
    socket = server.server.settings.unix_socket

    async def call() -> BaseException:
        channel = grpc.aio.insecure_channel(f"unix:{socket}")
        replica = Replica(f"unix:{socket}", channel, inference_pb2_grpc.InferenceStub(channel),
                          call_metadata(TOKEN))
        if transport == "frames":   # as the pool does for a unix: replica that serves
            replica.frame_keeper = FrameKeeper(replica.address, TOKEN, keepalive_s=0, backoff_s=0.1,
                                               target=replica.frame_target, instance_id=lambda: "")
            await replica.frame_keeper.start()
        try:
            assert replica.transport == transport
            await replica.call("Embed", embed_request([[5, 6, 7]]), 10.0, "round-trip")
        except REPLICA_CALL_ERRORS as error:
            return error
        finally:
            replica.close_frames()
            await channel.close()
        raise AssertionError("the call succeeded")
    return asyncio.run(call())


@pytest.mark.parametrize("transport", ["grpc", "frames"])
@pytest.mark.parametrize("cls", list(EXPECTED), ids=lambda cls: cls.__name__)
def test_every_error_class_round_trips(replica, cls, transport):
    server, engine = replica
    link_code, gateway_class, http_status, public_code = EXPECTED[cls]
    raised = _instance(cls)
    engine.fail_next = raised
    try:
        failure = _seen_by_gateway(server, transport)
    finally:
        # A lost device stops the replica taking calls; this one serves the next test.
        server.server.service.accepting = True
    assert failure.code() == link_code
    seen = from_replica_error(failure)
    assert type(seen) is gateway_class
    assert raised.message in seen.message
    assert status_for(seen)[0] == http_status
    assert api_status(seen).code == public_code


def test_a_status_that_names_no_class_is_read_by_its_code():
    """gRPC's own statuses, refusals before a handler, a replica of an earlier release."""
    from embedserve.link.status import from_rpc_error

    assert type(from_rpc_error(C.NOT_FOUND, "gone")) is errors.ModelNotFound
    assert type(from_rpc_error(C.INVALID_ARGUMENT, "bad")) is errors.InvalidInput
    # A name whose code does not match is not believed.
    assert type(from_rpc_error(C.UNAVAILABLE, "x", "InputTooLong")) is errors.Unavailable
