"""Hostile clients against a real ``embedserve scheduler`` replica's TCP frame port.

Each case holds the replica's memory (its RSS, read from /proc) within a bound and
checks that a valid call is served while the hostile client is connected and after
(docs/replica-link.md lists the bounds). The replica runs with a small
``--max-frame-connections`` so the cap is reached with few sockets.
"""

from __future__ import annotations

import asyncio
import socket
import struct
import tempfile
import time
from pathlib import Path

import grpc
import pytest

from embedserve.link import frames
from embedserve.link.frame_client import FrameChannel, ReplicaCallError
from embedserve.link.frame_server import FrameServer
from embedserve.protos import inference_pb2, inference_pb2_grpc
from embedserve.scheduler.settings import SchedulerSettings
from gateway_harness import SchedulerProcess
from scheduler_harness import ThreadedScheduler, embed_request

TOKEN = "hostile-test-token"
METADATA = (("authorization", f"Bearer {TOKEN}"),)
MAX_CONNECTIONS = 8
HANDSHAKE_S = 5.0   # the replica's handshake deadline (scheduler/server.py)


@pytest.fixture(scope="module")
def replica(tiny_bert_dir, tmp_path_factory):
    token_file = tmp_path_factory.mktemp("token") / "token"
    token_file.write_text(TOKEN)
    process = SchedulerProcess(tiny_bert_dir, "--replica-token-file", str(token_file),
                               "--max-frame-connections", str(MAX_CONNECTIONS), threads=1)
    try:
        with grpc.insecure_channel(process.address) as channel:
            info = inference_pb2_grpc.InferenceStub(channel).Info(inference_pb2.InfoRequest(),
                                                                  timeout=30, metadata=METADATA)
        process.frame_port = info.frame_port
        yield process
    finally:
        process.stop()


def rss_mb(replica: SchedulerProcess) -> float:
    with open(f"/proc/{replica.process.pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


def valid_calls(replica: SchedulerProcess) -> None:
    """One Embed over frames and one over gRPC, both answered in full."""
    request = embed_request([[5, 6, 7], [8, 9]])

    async def over_frames():
        channel = await FrameChannel.open(("127.0.0.1", replica.frame_port), TOKEN, timeout_s=30)
        try:
            return await channel.call("Embed", request, timeout=30)
        finally:
            channel.close()
    assert asyncio.run(over_frames()).embeddings.shape == [2, 32]
    with grpc.insecure_channel(replica.address) as channel:
        reply = inference_pb2_grpc.InferenceStub(channel).Embed(request, timeout=30, metadata=METADATA)
    assert reply.embeddings.shape == [2, 32]


def connect(replica: SchedulerProcess) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", replica.frame_port), timeout=30)
    return sock


def read_until_closed(sock: socket.socket, timeout: float) -> bytes:
    """Everything the replica sends until it closes the connection (within ``timeout``)."""
    sock.settimeout(timeout)
    received = b""
    while chunk := sock.recv(65536):
        received += chunk
    return received


def hello(token: str = TOKEN) -> bytes:
    return frames.frame(frames.HELLO, 0, token.encode())


def test_connections_that_never_say_hello_are_closed_at_the_handshake_deadline(replica):
    before = rss_mb(replica)
    idle = [connect(replica) for _ in range(3)]
    started = time.monotonic()
    valid_calls(replica)
    for sock in idle:
        with sock:
            assert read_until_closed(sock, timeout=HANDSHAKE_S + 15) == b""
    assert time.monotonic() - started >= HANDSHAKE_S - 1   # closed by the deadline, not at once
    valid_calls(replica)
    assert rss_mb(replica) - before < 50



def test_grpc_connections_that_never_send_the_http2_preface_are_closed_too(replica):
    """The gRPC port's handshake timeout (grpc.server_handshake_timeout_ms, scheduler/server.py):
    its default, 120 s, let idle connections pile up until the file descriptors ran out."""
    host, port = replica.address.rsplit(":", 1)
    idle = [socket.create_connection((host, int(port)), timeout=30) for _ in range(3)]
    started = time.monotonic()
    valid_calls(replica)
    for sock in idle:
        with sock:
            read_until_closed(sock, timeout=HANDSHAKE_S + 15)   # the server's SETTINGS, then EOF
    assert time.monotonic() - started < HANDSHAKE_S + 10
    valid_calls(replica)

def test_a_hello_larger_than_the_pre_authentication_limit_is_refused_at_its_header(replica):
    before = rss_mb(replica)
    with connect(replica) as sock:
        # The header announces 832 KiB; the replica answers at the header, reading none of it.
        sock.sendall(struct.pack("<IIBBBBI", 851_968, 0, frames.HELLO, 0, frames.MAGIC,
                                 frames.VERSION, 0) + bytes(1000))
        (answer,) = frames.FrameReader(1 << 16).feed(read_until_closed(sock, timeout=20))
    assert frames.status_code(answer.arg) is grpc.StatusCode.INVALID_ARGUMENT
    assert answer.payload.decode() == \
        f"the first frame must be a HELLO of at most {frames.MAX_HELLO_BYTES} bytes"
    # Half-sent HELLOs at the limit: each holds at most a header and MAX_HELLO_BYTES.
    half = [connect(replica) for _ in range(MAX_CONNECTIONS - 1)]
    try:
        for sock in half:
            sock.sendall(struct.pack("<IIBBBBI", frames.MAX_HELLO_BYTES, 0, frames.HELLO, 0,
                                     frames.MAGIC, frames.VERSION, 0) + bytes(frames.MAX_HELLO_BYTES - 1))
        valid_calls(replica)
        assert rss_mb(replica) - before < 50
    finally:
        for sock in half:
            sock.close()
    valid_calls(replica)


def test_connections_beyond_the_cap_are_closed_at_once(replica):
    before = rss_mb(replica)
    held = [connect(replica) for _ in range(MAX_CONNECTIONS)]
    try:
        time.sleep(0.5)   # all accepted
        with connect(replica) as extra:
            started = time.monotonic()
            assert read_until_closed(extra, timeout=HANDSHAKE_S + 15) == b""
            assert time.monotonic() - started < HANDSHAKE_S - 1   # at once, not at the deadline
        # gRPC serves on while the frame port is full.
        with grpc.insecure_channel(replica.address) as channel:
            reply = inference_pb2_grpc.InferenceStub(channel).Embed(embed_request([[5, 6]]), timeout=30,
                                                                    metadata=METADATA)
        assert reply.embeddings.shape == [1, 32]
    finally:
        for sock in held:
            sock.close()
    time.sleep(0.5)
    valid_calls(replica)   # the places are free again
    assert rss_mb(replica) - before < 50


def test_a_call_id_reused_while_in_flight_closes_the_connection(replica):
    before = rss_mb(replica)
    call = embed_request([[5, 6, 7]] * 200).SerializeToString()
    with connect(replica) as sock:
        sock.sendall(hello() + frames.frame(frames.CALL, 5, call, arg=frames.METHOD_NUMBERS["Embed"])
                     + frames.frame(frames.CALL, 5, call, arg=frames.METHOD_NUMBERS["Embed"]))
        answers = frames.FrameReader(1 << 24).feed(read_until_closed(sock, timeout=20))
    # The HELLO is answered; neither call is (both are cancelled with the connection).
    assert [(a.kind, frames.status_code(a.arg)) for a in answers] == [(frames.HELLO, grpc.StatusCode.OK)]
    valid_calls(replica)
    assert rss_mb(replica) - before < 50


def _status(replica: SchedulerProcess, request: inference_pb2.EmbedRequest) -> dict[str, tuple]:
    """The (code, details) of ``request`` refused over frames and over gRPC."""
    async def over_frames():
        channel = await FrameChannel.open(("127.0.0.1", replica.frame_port), TOKEN, timeout_s=30)
        try:
            with pytest.raises(ReplicaCallError) as info:
                await channel.call("Embed", request, timeout=60)
            return info.value.code(), info.value.details()
        finally:
            channel.close()
    with grpc.insecure_channel(replica.address) as channel, pytest.raises(grpc.RpcError) as info:
        inference_pb2_grpc.InferenceStub(channel).Embed(request, timeout=60, metadata=METADATA)
    return {"frames": asyncio.run(over_frames()), "grpc": (info.value.code(), info.value.details())}


def test_a_precision_named_twice_is_refused_before_any_compute(replica):
    before = rss_mb(replica)
    # 100 KB of requests naming float32 10,000 times: once 155 MB of reply.
    request = embed_request([[5, 6, 7]] * 100, precisions=[inference_pb2.PRECISION_FLOAT32] * 10_000)
    for code, details in _status(replica, request).values():
        assert (code, details) == (grpc.StatusCode.INVALID_ARGUMENT, "precision float32 is named twice")
    valid_calls(replica)
    assert rss_mb(replica) - before < 50


def test_a_call_whose_reply_would_exceed_the_limit_is_refused_before_any_compute(replica):
    """40,000 one-token sequences in all six precisions: 10.6 MB of vectors, over the
    replica's limit for 65,536 queued tokens of float32 (4 * 65,536 * 32 bytes)."""
    before = rss_mb(replica)
    request = embed_request([[5]] * 40_000, precisions=list(range(6)))
    for code, details in _status(replica, request).values():
        assert code is grpc.StatusCode.INVALID_ARGUMENT
        assert details == ("the reply would be 10560000 bytes, over this replica's limit of 8388608; "
                           "send fewer sequences per call or fewer precisions")
    valid_calls(replica)
    assert rss_mb(replica) - before < 50



# -- write backpressure, on a frame server of the replica's own handlers ------------

def own_rss_mb() -> float:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


@pytest.fixture(scope="module")
def small_buffer_frames(bert_engine, tiny_bert_dir):
    """A real replica (in this process: its RSS is this process's) and, beside its own
    frame socket, a FrameServer of the same handlers whose write buffer mark is 1 MiB
    instead of 16 MiB: reached in a second on this 2-core machine, where 16 MiB of
    replies take a tiny model about a minute."""
    with tempfile.TemporaryDirectory(prefix="es-") as directory:   # short: sun_path is 108 bytes
        settings = SchedulerSettings(model_dir=tiny_bert_dir, unix_socket=Path(directory) / "r.sock",
                                     replica_token=TOKEN)
        with ThreadedScheduler(settings, bert_engine) as server:
            service = server.server.service
            frame_server = FrameServer(service, TOKEN, max_payload=1 << 24, max_calls=64,
                                       write_buffer_high=1 << 20, write_buffer_low=256 << 10)
            path = Path(directory) / "small.frames"
            server.call(frame_server.start_unix(path))
            try:
                yield path
            finally:
                server.call(frame_server.stop(grace_s=0))


def test_a_client_that_never_reads_its_replies_stops_being_read(small_buffer_frames):
    """A client sends Embed calls of 8,000 one-token sequences (a 64 KB request, a 1 MB
    reply) and reads nothing. Read without backpressure, every call is taken in (most
    refused while the queue is full, the rest answered into memory) and the client's
    sends never block: 600 calls would be read. With it, the replica stops reading once
    1 MiB of replies wait, the client's sends fill the kernel's buffers and stop, and
    the replica's memory stays bounded; another client is served meanwhile and after."""
    path = small_buffer_frames

    def valid_call() -> None:
        async def call():
            channel = await FrameChannel.open(path, TOKEN, timeout_s=30)
            try:
                return await channel.call("Embed", embed_request([[5, 6, 7], [8, 9]]), timeout=30)
            finally:
                channel.close()
        assert asyncio.run(call()).embeddings.shape == [2, 32]

    valid_call()
    before = own_rss_mb()
    body = embed_request([[5]] * 8000).SerializeToString()
    flood = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        flood.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
        flood.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        flood.connect(str(path))
        flood.sendall(hello())
        flood.setblocking(False)
        calls, sent, stalled = 600, 0, False
        for call_id in range(1, calls + 1):
            data = memoryview(frames.frame(frames.CALL, call_id, body, arg=frames.METHOD_NUMBERS["Embed"]))
            stall_from = time.monotonic()
            while data:
                try:
                    written = flood.send(data)
                except BlockingIOError:
                    written = 0
                data = data[written:]
                if written:
                    stall_from = time.monotonic()
                elif time.monotonic() - stall_from > 3.0:
                    stalled = True
                    break
                else:
                    time.sleep(0.005)
            if stalled:
                break
            sent += 1
            time.sleep(0.002)
        assert stalled and sent < calls / 2, (
            f"the replica read {sent} of {calls} calls from a client that reads none of its replies")
        valid_call()   # while the client is still connected, not read
        grown = own_rss_mb() - before
        assert grown < 100, f"the replica grew {grown:.0f} MB for a client that reads nothing"
    finally:
        flood.close()
    valid_call()
