"""The frame protocol's version and method table (embedserve/link/frames.py, docs/replica-link.md).

A gateway and a replica of different releases must never exchange a call whose method
number means another method to the other end: the HELLO of another version is refused
by the replica, the HELLO answer of another version by the gateway, before any CALL.
Other versions are spoken for real: by raw sockets writing the old header (two zero
bytes where magic and version are), and by a replica process whose ``frames.VERSION``
is set to another number before it starts.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import struct
import tempfile
from pathlib import Path

import grpc
import httpx
import pytest

from embedserve.link import frames
from embedserve.link.frame_client import FrameChannel, FrameVersionMismatch
from embedserve.protos import inference_pb2
from embedserve.scheduler.settings import SchedulerSettings
from gateway_harness import SchedulerProcess, gateway_in_front_of, replica_view
from scheduler_harness import ThreadedScheduler, embed_request

TOKEN = "version-test-token"
# The header of frames before version 1: the same fields, padding where magic and version are.
OLD_HEADER = struct.Struct("<IIBBxxI")


def test_the_method_numbers_are_pinned():
    # Changing a number misroutes calls between releases; a new method takes a new number.
    assert frames.METHOD_NUMBERS == {"Embed": 1, "Score": 2, "Info": 3, "Ranges": 4, "Classify": 5,
                                     "EmbedSparse": 6, "EmbedTokens": 7}
    assert {number: method.name for number, method in frames.METHODS.items()} == \
        {1: "Embed", 2: "Score", 3: "Info", 4: "Ranges", 5: "Classify", 6: "EmbedSparse",
         7: "EmbedTokens"}
    service = inference_pb2.DESCRIPTOR.services_by_name["Inference"]
    assert set(frames.METHOD_NUMBERS) == {m.name for m in service.methods}, \
        "a method of the proto has no frame number (or a number names no method)"
    for method in service.methods:
        assert frames.METHODS[frames.METHOD_NUMBERS[method.name]].request_type.DESCRIPTOR is method.input_type


def test_every_frame_carries_the_magic_and_the_version():
    header = frames.frame(frames.CALL, 7, b"xy", arg=1, timeout_us=5)[:frames.HEADER.size]
    assert header == struct.pack("<IIBBBBI", 2, 7, frames.CALL, 1, 0xE5, frames.VERSION, 5)
    (item,) = frames.FrameReader(1 << 10).feed(frames.frame(frames.CALL, 7, b"xy", arg=1))
    assert (item.magic, item.version, item.payload) == (frames.MAGIC, frames.VERSION, b"xy")


@pytest.fixture(scope="module")
def replica(bert_engine, tiny_bert_dir):
    with tempfile.TemporaryDirectory(prefix="es-") as directory:
        settings = SchedulerSettings(model_dir=tiny_bert_dir, unix_socket=Path(directory) / "r.sock",
                                     replica_token=TOKEN, max_batch_tokens=512)
        with ThreadedScheduler(settings, bert_engine) as server:
            yield server


def _exchange_raw(path: Path, data: bytes) -> list[frames.Frame]:
    """Send ``data`` on a fresh connection to ``path``; every frame read until it closes."""
    with socket.socket(socket.AF_UNIX) as s:
        s.settimeout(20)
        s.connect(str(path))
        s.sendall(data)
        received = b""
        while chunk := s.recv(65536):
            received += chunk
    reader = frames.FrameReader(1 << 20)
    return reader.feed(received)


@pytest.mark.parametrize("version", [0, 2])
def test_a_gateway_of_another_version_is_refused_before_any_call(replica, version, caplog):
    """HELLO and an Embed CALL in one write, as an old (0) or a newer (2) gateway: the
    replica answers only the HELLO, FAILED_PRECONDITION naming both versions, and closes."""
    path = frames.frame_socket_path(replica.server.settings.unix_socket)
    call = embed_request([[5, 6, 7]]).SerializeToString()
    if version == 0:
        data = (OLD_HEADER.pack(len(TOKEN), 0, frames.HELLO, 0, 0) + TOKEN.encode()
                + OLD_HEADER.pack(len(call), 1, frames.CALL, 0, 0) + call)
    else:
        head = struct.Struct("<IIBBBBI")
        data = (head.pack(len(TOKEN), 0, frames.HELLO, 0, frames.MAGIC, version, 0) + TOKEN.encode()
                + head.pack(len(call), 1, frames.CALL, 1, frames.MAGIC, version, 0) + call)
    with caplog.at_level(logging.WARNING, logger="embedserve.link.frame_server"):
        answers = _exchange_raw(path, data)
    assert [(a.kind, a.call_id) for a in answers] == [(frames.HELLO, 0)]   # no REPLY to the call
    assert frames.status_code(answers[0].arg) is grpc.StatusCode.FAILED_PRECONDITION
    assert answers[0].payload.decode() == (f"frame version {version} is not this replica's version "
                                           f"{frames.VERSION}; call it over gRPC")
    assert f"it speaks frame version {version}, this replica version {frames.VERSION}" in caplog.text


@pytest.mark.parametrize("version", [0, 2])
def test_a_replica_of_another_version_is_refused_before_any_call(version, tmp_path):
    """A replica that accepts the HELLO but answers in another version (0: a release
    before the check, which cannot refuse): the gateway's channel sends no CALL."""
    path = Path(tempfile.mkdtemp(prefix="es-")) / "old.frames"
    received: list[int] = []

    async def run():
        async def old_replica(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            while data := await reader.read(65536):
                for item in frames.FrameReader(1 << 20).feed(data):
                    received.append(item.kind)
                    if item.kind == frames.HELLO:
                        header = (OLD_HEADER.pack(2, item.call_id, frames.HELLO, 0, 0) if version == 0 else
                                  struct.pack("<IIBBBBI", 2, item.call_id, frames.HELLO, 0,
                                              frames.MAGIC, version, 0))
                        writer.write(header + b"id")
        server = await asyncio.start_unix_server(old_replica, str(path))
        try:
            with pytest.raises(FrameVersionMismatch) as info:
                await FrameChannel.open(path, TOKEN, timeout_s=10)
            await asyncio.sleep(0.1)
        finally:
            server.close()
        return info.value

    error = asyncio.run(run())
    assert error.code() is grpc.StatusCode.FAILED_PRECONDITION
    assert (f"speaks frame version {version}" if version else "not an embedserve frame") in error.details()
    assert received == [frames.HELLO]


def test_a_gateway_and_a_replica_of_different_versions_talk_grpc(tiny_bert_dir, tmp_path, monkeypatch,
                                                                 caplog, capfd):
    """A real replica process speaking frame version 99 behind this gateway (version 1):
    the gateway logs the refusal and calls it over gRPC, and the answers are right."""
    (tmp_path / "sitecustomize.py").write_text("import embedserve.link.frames\nembedserve.link.frames.VERSION = 99\n")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]))
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN)
    replica = SchedulerProcess(tiny_bert_dir, "--replica-token-file", str(token_file), threads=1)
    try:
        with caplog.at_level(logging.WARNING, logger="embedserve.gateway.replicas"), \
                gateway_in_front_of(replica, replica_token=TOKEN) as server:
            assert replica_view(server)["calls"] == "grpc"
            reply = httpx.post(server.url + "/v1/embeddings", json={"input": ["a mixed upgrade"]}, timeout=60)
            assert reply.status_code == 200, reply.text
            assert len(reply.json()["data"][0]["embedding"]) == 32
    finally:
        replica.stop()
    # Each end names both versions: the gateway reads the replica's in its answer's header.
    assert "the replica speaks frame version 99, this gateway version 1; calling it over gRPC" in caplog.text
    assert "it speaks frame version 1, this replica version 99" in capfd.readouterr().err
