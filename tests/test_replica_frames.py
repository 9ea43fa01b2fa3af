"""Replica calls as frames over the replica's Unix socket and its TCP frame port
(embedserve/link/frames.py).

A real scheduler (``ThreadedScheduler``, a tiny model) with ``unix_socket`` set serves
gRPC and frames at once; a ``FrameChannel`` on a loop of its own (as a gateway's) calls
it. The reference is the same replica's gRPC answer: same vectors, same status codes
and details, the same handling of deadlines, cancellation and overload.
"""

from __future__ import annotations

import asyncio
import socket
import tempfile
from pathlib import Path

import grpc
import numpy as np
import pytest

from embedserve import ragged
from embedserve.engine import Engine
from embedserve.link import frames, wire
from embedserve.link.frame_client import FrameChannel, ReplicaCallError
from embedserve.protos import inference_pb2
from embedserve.scheduler.settings import SchedulerSettings
from scheduler_harness import RecordingEngine, ThreadedScheduler, embed_request, random_sequences, wait_until

TOKEN = "frames-test-token"
METADATA = (("authorization", f"Bearer {TOKEN}"),)


@pytest.fixture
def socket_dir():
    with tempfile.TemporaryDirectory(prefix="es-") as directory:   # short: sun_path is 108 bytes
        yield Path(directory)


def _settings(model_dir: Path, socket_dir: Path, **overrides) -> SchedulerSettings:
    return SchedulerSettings(model_dir=model_dir, unix_socket=socket_dir / "r.sock",
                             replica_token=TOKEN, **overrides)


@pytest.fixture(scope="module")
def replica(bert_engine, tiny_bert_dir):
    with tempfile.TemporaryDirectory(prefix="es-") as directory:
        settings = _settings(tiny_bert_dir, Path(directory), max_batch_tokens=512, metrics_port=0)
        with ThreadedScheduler(settings, bert_engine) as server:
            yield server


def frame_path(server: ThreadedScheduler) -> Path:
    return frames.frame_socket_path(server.server.settings.unix_socket)


def tcp_frame_target(server: ThreadedScheduler) -> tuple[str, int]:
    """Where a remote gateway would call: the host it reaches the replica at, and the
    frame port the replica's Info names."""
    return "127.0.0.1", server.stub.Info(inference_pb2.InfoRequest(), timeout=10, metadata=METADATA).frame_port


def over_frames(server: ThreadedScheduler, calls, token: str | None = TOKEN, tcp: bool = False,
                instance_id: str = ""):
    """Open a channel on a fresh loop (as a gateway's), run ``calls(channel)``, close."""
    target = tcp_frame_target(server) if tcp else frame_path(server)

    async def run():
        channel = await FrameChannel.open(target, token, timeout_s=10, instance_id=instance_id)
        try:
            return await calls(channel)
        finally:
            channel.close()
    return asyncio.run(run())


def grpc_status(server: ThreadedScheduler, method: str, request) -> tuple[grpc.StatusCode, str]:
    with pytest.raises(grpc.RpcError) as info:
        getattr(server.stub, method)(request, timeout=10, metadata=(("authorization", f"Bearer {TOKEN}"),))
    return info.value.code(), info.value.details()


def frame_status(server: ThreadedScheduler, method: str, request) -> tuple[grpc.StatusCode, str]:
    async def call(channel):
        with pytest.raises(ReplicaCallError) as info:
            await channel.call(method, request, timeout=10)
        return info.value.code(), info.value.details()
    return over_frames(server, call)


def test_the_socket_sits_beside_the_grpc_socket(replica):
    assert replica.server.settings.unix_socket.is_socket()
    assert frame_path(replica).is_socket()
    assert frame_path(replica).name == "r.sock.frames"


def test_embed_and_info_answer_as_grpc_does(replica):
    sequences = random_sequences(np.random.default_rng(3), 6, 1, 200)
    request = embed_request(sequences, request_id="frames-1", normalize=True)
    metadata = (("authorization", f"Bearer {TOKEN}"),)
    by_grpc = replica.stub.Embed(request, timeout=30, metadata=metadata)

    async def calls(channel):
        return (await channel.call("Embed", request, timeout=30),
                await channel.call("Info", inference_pb2.InfoRequest(), timeout=10))
    by_frames, info = over_frames(replica, calls)
    assert by_frames.request_id == "frames-1"
    np.testing.assert_array_equal(wire.tensor_to_array(by_frames.embeddings),
                                  wire.tensor_to_array(by_grpc.embeddings))
    assert info == replica.stub.Info(inference_pb2.InfoRequest(), timeout=10, metadata=metadata)
    assert replica.counter("embedserve_scheduler_calls_total", method="Embed", code="OK") >= 2


def _i32(*values: int) -> bytes:
    return np.array(values, dtype="<i4").tobytes()


@pytest.mark.parametrize("method, request_", [
    ("Embed", inference_pb2.EmbedRequest(tokens=inference_pb2.PackedTokens(token_ids=b"", lengths=b""))),
    ("Embed", inference_pb2.EmbedRequest(tokens=inference_pb2.PackedTokens(
        token_ids=_i32(5, 250_002), lengths=_i32(2)))),
    ("Embed", inference_pb2.EmbedRequest(tokens=inference_pb2.PackedTokens(
        token_ids=_i32(5, 6), lengths=_i32(2)), dimensions=33)),
    ("Score", inference_pb2.ScoreRequest(pairs=inference_pb2.PackedTokens(
        token_ids=_i32(0, 5, 2), lengths=_i32(3)))),
    ("Ranges", inference_pb2.RangesRequest(dimensions=16)),
])
def test_bad_calls_get_grpcs_status_and_details(replica, method, request_):
    code, details = frame_status(replica, method, request_)
    assert code is not grpc.StatusCode.OK
    assert (code, details) == grpc_status(replica, method, request_)


def test_two_hundred_calls_in_flight_each_get_their_own_rows(replica, bert_engine):
    rng = np.random.default_rng(4)
    batches = [random_sequences(rng, int(rng.integers(1, 4)), 1, 60) for _ in range(200)]

    async def calls(channel):
        return await asyncio.gather(*(channel.call("Embed", embed_request(b, request_id=str(k)), timeout=60)
                                      for k, b in enumerate(batches)))
    steps_before = replica.counter("embedserve_scheduler_batch_sequences_count")
    replies = over_frames(replica, calls)
    # The loop computes these calls' steps itself; the calls that arrive meanwhile are
    # still read in one go afterwards and batched together, not stepped one by one.
    assert replica.counter("embedserve_scheduler_batch_sequences_count") - steps_before < 50
    metadata = (("authorization", f"Bearer {TOKEN}"),)
    for k in (0, 57, 199):   # spot checks against gRPC, rows and ids
        expected = wire.tensor_to_array(replica.stub.Embed(embed_request(batches[k]), timeout=30,
                                                           metadata=metadata).embeddings)
        np.testing.assert_allclose(wire.tensor_to_array(replies[k].embeddings), expected, rtol=1e-5, atol=1e-6)
    for k, reply in enumerate(replies):
        assert reply.request_id == str(k)
        assert reply.embeddings.shape[0] == len(batches[k])


@pytest.mark.parametrize("tcp", [False, True], ids=["unix", "tcp"])
@pytest.mark.parametrize("token", [None, "wrong-token"])
def test_a_connection_without_the_token_is_refused(replica, token, tcp):
    with pytest.raises(ReplicaCallError) as info:
        over_frames(replica, lambda channel: channel.call("Info", inference_pb2.InfoRequest(), 5),
                    token=token, tcp=tcp)
    assert info.value.code() is grpc.StatusCode.UNAUTHENTICATED


def test_the_tcp_frame_port_info_names_answers_as_grpc_does(replica):
    info = replica.stub.Info(inference_pb2.InfoRequest(), timeout=10, metadata=METADATA)
    assert info.frame_port > 0 and info.frame_port != replica.port
    assert len(info.instance_id) == 16
    sequences = random_sequences(np.random.default_rng(5), 5, 1, 120)
    request = embed_request(sequences, request_id="tcp-1", normalize=True)
    by_grpc = replica.stub.Embed(request, timeout=30, metadata=METADATA)

    async def calls(channel):
        # Nagle off on the gateway's end: a small frame must not wait for an ACK.
        sock = channel._transport.get_extra_info("socket")
        nodelay = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)
        return await channel.call("Embed", request, timeout=30), nodelay
    by_frames, nodelay = over_frames(replica, calls, tcp=True, instance_id=info.instance_id)
    assert nodelay
    assert by_frames.request_id == "tcp-1"
    np.testing.assert_array_equal(wire.tensor_to_array(by_frames.embeddings),
                                  wire.tensor_to_array(by_grpc.embeddings))


@pytest.mark.parametrize("tcp", [False, True], ids=["unix", "tcp"])
def test_a_channel_to_another_process_than_info_named_is_refused(replica, tcp):
    with pytest.raises(ReplicaCallError) as info:
        over_frames(replica, lambda channel: channel.call("Info", inference_pb2.InfoRequest(), 5),
                    tcp=tcp, instance_id="0123456789abcdef")
    assert info.value.code() is grpc.StatusCode.FAILED_PRECONDITION
    assert "another replica process" in info.value.details()


def test_no_tcp_frame_port_when_off(bert_engine, tiny_bert_dir, socket_dir):
    settings = _settings(tiny_bert_dir, socket_dir, max_batch_tokens=512, frame_port=None)
    with ThreadedScheduler(settings, bert_engine) as server:
        assert server.stub.Info(inference_pb2.InfoRequest(), timeout=10, metadata=METADATA).frame_port == 0
        assert frame_path(server).is_socket()   # the Unix one is separate


def test_a_frame_port_in_use_fails_the_start_with_its_address(bert_engine, tiny_bert_dir, socket_dir):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        settings = _settings(tiny_bert_dir, socket_dir, max_batch_tokens=512, frame_port=port)
        with pytest.raises(OSError, match=f"cannot bind the frame socket to 127.0.0.1:{port}"):
            ThreadedScheduler(settings, bert_engine)


def test_undecodable_and_oversized_calls_are_refused_and_the_connection_serves_on(replica):
    limit = replica.server.frame_server.max_payload

    async def raw(channel_socket: socket.socket, kind: int, call_id: int, payload: bytes, arg: int = 0):
        loop = asyncio.get_running_loop()
        await loop.sock_sendall(channel_socket, frames.frame(kind, call_id, payload, arg=arg))
        reader = frames.FrameReader(1 << 30)
        data = b""
        while True:
            data = await loop.sock_recv(channel_socket, 65536)
            assert data, "the replica closed the connection"
            got = list(reader.feed(data))
            if got:
                return got[0]

    async def run():
        with socket.socket(socket.AF_UNIX) as s:
            s.setblocking(False)
            await asyncio.get_running_loop().sock_connect(s, str(frame_path(replica)))
            hello = await raw(s, frames.HELLO, 0, TOKEN.encode())
            assert frames.status_code(hello.arg) is grpc.StatusCode.OK
            bad = await raw(s, frames.CALL, 1, b"\xff\xff\xff", arg=frames.METHOD_NUMBERS["Embed"])
            big = await raw(s, frames.CALL, 2, bytes(limit + 1), arg=frames.METHOD_NUMBERS["Embed"])
            unknown = await raw(s, frames.CALL, 3, b"", arg=200)
            good = await raw(s, frames.CALL, 4, embed_request([[5, 6, 7]]).SerializeToString(),
                             arg=frames.METHOD_NUMBERS["Embed"])
            return bad, big, unknown, good
    bad, big, unknown, good = asyncio.run(run())
    assert (bad.call_id, frames.status_code(bad.arg)) == (1, grpc.StatusCode.INVALID_ARGUMENT)
    assert (big.call_id, frames.status_code(big.arg)) == (2, grpc.StatusCode.RESOURCE_EXHAUSTED)
    assert b"limit" in big.payload
    assert (unknown.call_id, frames.status_code(unknown.arg)) == (3, grpc.StatusCode.UNIMPLEMENTED)
    assert (good.call_id, frames.status_code(good.arg)) == (4, grpc.StatusCode.OK)
    assert inference_pb2.EmbedResponse.FromString(good.payload).embeddings.shape == [1, 32]


def test_the_reader_cuts_frames_at_any_byte_boundary():
    stream = b"".join(frames.frame(frames.REPLY, k, bytes([k]) * k, arg=k % 3) for k in range(40))
    for cut in (1, 7, 16, 17, 100):
        reader = frames.FrameReader(1 << 20)
        got = [f for i in range(0, len(stream), cut) for f in reader.feed(stream[i:i + cut])]
        assert [(f.call_id, f.arg, f.payload) for f in got] == [(k, k % 3, bytes([k]) * k) for k in range(40)]


def test_an_oversized_frame_split_across_reads_is_skipped_whole():
    reader = frames.FrameReader(10)
    stream = frames.frame(frames.CALL, 1, bytes(50)) + frames.frame(frames.CALL, 2, b"ok")
    got = [f for i in range(0, len(stream), 9) for f in reader.feed(stream[i:i + 9])]
    assert [(f.call_id, f.oversized, f.payload) for f in got] == [(1, True, b""), (2, False, b"ok")]


def test_calls_over_frames_ask_for_inline_steps_and_grpc_calls_do_not(bert_engine, tiny_bert_dir,
                                                                        socket_dir):
    # Frames hand the loop every call that arrived during a step at once; grpc.aio about
    # one per turn, so its calls' steps stay on the engine's worker (scheduler/batcher.py).
    recorder = RecordingEngine(bert_engine)
    with ThreadedScheduler(_settings(tiny_bert_dir, socket_dir), recorder) as server:
        warm_up = len(recorder.inline_asked)
        over_frames(server, lambda channel: channel.call("Embed", embed_request([[5, 6, 7]]), 30))
        over_frames_steps = recorder.inline_asked[warm_up:]
        metadata = (("authorization", f"Bearer {TOKEN}"),)
        server.stub.Embed(embed_request([[5, 6, 8]]), timeout=30, metadata=metadata)
        grpc_steps = recorder.inline_asked[warm_up + len(over_frames_steps):]
    recorder.close()
    assert over_frames_steps == [True] and grpc_steps == [False]


# -- with the engine held shut: deadlines, cancellation, a replica going away ---------


@pytest.fixture
def gated(bert_engine, tiny_bert_dir, socket_dir):
    """A replica whose engine is held shut, with one call already in it."""
    recorder = RecordingEngine(bert_engine)
    settings = _settings(tiny_bert_dir, socket_dir, max_batch_tokens=64, in_flight_depth=1,
                         max_queue_tokens=600)
    with ThreadedScheduler(settings, recorder) as server:
        recorder.gate.clear()
        steps_before = recorder.steps   # the warm-up's
        blocker = server.stub.Embed.future(embed_request([[5, 6, 7]]), timeout=60,
                                           metadata=(("authorization", f"Bearer {TOKEN}"),))
        wait_until(lambda: recorder.steps == steps_before + 1, what="a step in the engine")
        yield server, recorder
        recorder.gate.set()
        assert list(blocker.result(30).embeddings.shape) == [1, 32]
    recorder.close()


def _ran(recorder: RecordingEngine, marker: int) -> bool:
    return any(marker in sequence for sequence in recorder.stepped)


def test_a_cancelled_caller_cancels_the_call_on_the_replica(gated):
    server, recorder = gated

    async def calls(channel):
        task = asyncio.create_task(channel.call("Embed", embed_request([[4242] * 5] * 3), timeout=60))
        while server.server.pool.queued_sequences < 3:
            await asyncio.sleep(0.005)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await asyncio.to_thread(wait_until, lambda: server.counter(
            "embedserve_scheduler_calls_dropped_total", reason="cancelled") == 1)
        recorder.gate.set()
        # The connection serves on after the cancel.
        return await channel.call("Embed", embed_request([[9, 9]]), timeout=30)
    after = over_frames(server, calls)
    assert list(after.embeddings.shape) == [1, 32]
    assert not _ran(recorder, 4242)
    assert server.counter("embedserve_scheduler_calls_total", method="Embed", code="CANCELLED") == 1


def test_a_call_cancelled_in_the_same_read_never_starts_and_is_counted_as_dropped(gated):
    # A replica whose loop computes its steps reads a CALL and the CANCEL that followed it
    # in one go, once the step ends: the call must not run, and still show in the metrics.
    server, recorder = gated
    embed = frames.METHOD_NUMBERS["Embed"]

    async def run():
        loop = asyncio.get_running_loop()
        with socket.socket(socket.AF_UNIX) as s:
            s.setblocking(False)
            await loop.sock_connect(s, str(frame_path(server)))
            await loop.sock_sendall(s, frames.frame(frames.HELLO, 0, TOKEN.encode()))
            await loop.sock_sendall(s, frames.frame(frames.CALL, 1, embed_request([[4343] * 4]).SerializeToString(),
                                                    arg=embed) + frames.frame(frames.CANCEL, 1))
            await asyncio.to_thread(wait_until, lambda: server.counter(
                "embedserve_scheduler_calls_dropped_total", reason="cancelled") == 1)
    asyncio.run(run())
    assert server.counter("embedserve_scheduler_calls_total", method="Embed", code="CANCELLED") == 1
    assert server.server.pool.queued_sequences == 0
    recorder.gate.set()
    assert not _ran(recorder, 4343)


def test_a_call_past_its_deadline_is_deadline_exceeded_on_both_sides(gated):
    server, recorder = gated

    async def calls(channel):
        with pytest.raises(ReplicaCallError) as info:
            await channel.call("Embed", embed_request([[4343] * 5] * 3), timeout=1.0)
        return info.value.code()
    assert over_frames(server, calls) is grpc.StatusCode.DEADLINE_EXCEEDED
    wait_until(lambda: sum(server.counter("embedserve_scheduler_calls_dropped_total", reason=r)
                           for r in ("deadline", "cancelled")) == 1, what="the replica to drop the call")
    recorder.gate.set()
    assert not _ran(recorder, 4343)


def test_calls_in_flight_fail_unavailable_when_the_replica_stops(gated):
    server, recorder = gated

    async def calls(channel):
        task = asyncio.create_task(channel.call("Embed", embed_request([[4444] * 5]), timeout=60))
        while server.server.pool.queued_sequences < 1:
            await asyncio.sleep(0.005)
        # The replica's own shutdown path with no grace: its frame calls are cut.
        await asyncio.wrap_future(server.submit(server.server.frame_server.stop(grace_s=0)))
        with pytest.raises(ReplicaCallError) as info:
            await task
        assert channel.closed
        with pytest.raises(ReplicaCallError) as later:
            await channel.call("Embed", embed_request([[5]]), timeout=5)
        return info.value.code(), later.value.code()
    assert over_frames(server, calls) == (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.UNAVAILABLE)
    recorder.gate.set()


def test_score_and_ranges_answer_as_grpc_does(tiny_bert_reranker_dir, tiny_bert_dir, bert_engine, tmp_path):
    metadata = (("authorization", f"Bearer {TOKEN}"),)
    rng = np.random.default_rng(5)
    pairs = [rng.integers(5, 1000, int(rng.integers(3, 40))).astype(np.int32) for _ in range(5)]
    score = inference_pb2.ScoreRequest(pairs=wire.pack_tokens(ragged.from_sequences(pairs)), sigmoid=True)
    reranker = Engine.load(tiny_bert_reranker_dir)
    try:
        with tempfile.TemporaryDirectory(prefix="es-") as directory, \
                ThreadedScheduler(_settings(tiny_bert_reranker_dir, Path(directory)), reranker) as server:
            by_frames = over_frames(server, lambda channel: channel.call("Score", score, timeout=30))
            by_grpc = server.stub.Score(score, timeout=30, metadata=metadata)
    finally:
        reranker.close()
    assert by_frames.scores.shape == [5]
    np.testing.assert_array_equal(wire.tensor_to_array(by_frames.scores), wire.tensor_to_array(by_grpc.scores))

    ranges = inference_pb2.RangesRequest(dimensions=16, normalize=True)
    with tempfile.TemporaryDirectory(prefix="es-") as directory, \
            ThreadedScheduler(_settings(tiny_bert_dir, Path(directory), calibration_cache_dir=tmp_path),
                              bert_engine) as server:
        by_frames = over_frames(server, lambda channel: channel.call("Ranges", ranges, timeout=30))
        by_grpc = server.stub.Ranges(ranges, timeout=30, metadata=metadata)
    assert by_frames.calibration_id and by_frames == by_grpc


def test_a_replica_that_never_answers_fails_the_call_at_its_deadline_and_is_told(socket_dir):
    """The gateway's own deadline, with nobody on the other side enforcing one: a socket
    that says HELLO and then only listens."""
    path = socket_dir / "silent.frames"
    received: list[frames.Frame] = []

    async def run():
        cancel_seen = asyncio.Event()

        async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            frame_reader = frames.FrameReader(1 << 20)
            while data := await reader.read(65536):
                for item in frame_reader.feed(data):
                    received.append(item)
                    if item.kind == frames.HELLO:
                        writer.write(frames.frame(frames.HELLO, item.call_id, arg=0))
                    elif item.kind == frames.CANCEL:
                        cancel_seen.set()

        server = await asyncio.start_unix_server(silent, str(path))
        channel = await FrameChannel.open(path, None, timeout_s=10)
        try:
            started = asyncio.get_running_loop().time()
            with pytest.raises(ReplicaCallError) as info:
                await channel.call("Embed", embed_request([[5, 6]]), timeout=0.3)
            waited = asyncio.get_running_loop().time() - started
            await asyncio.wait_for(cancel_seen.wait(), 10)
            assert not channel.closed   # the connection serves on
        finally:
            channel.close()
            server.close()
        return info.value.code(), waited

    code, waited = asyncio.run(run())
    assert code is grpc.StatusCode.DEADLINE_EXCEEDED and waited >= 0.29
    call, cancel = [f for f in received if f.kind in (frames.CALL, frames.CANCEL)]
    assert call.call_id == cancel.call_id and 0 < call.timeout_us <= 300_000
