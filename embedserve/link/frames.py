"""Replica calls as length-prefixed protobuf frames over a socket: the envelope.

A gateway calls its replicas' Embed/Score/Ranges through this instead of gRPC:
grpc.aio's unary call costs about a millisecond of Python on each side here
(``python -m bench grpc_transport``), a frame round trip a tenth of that. gRPC stays
the replica's interface for everything else (health, reflection, ``Info``, and calls
whenever no frame connection is open); the messages in frames are the same
``embedserve.v1`` protobufs and the status codes gRPC's, so both transports give a
caller the same answers and the same errors.

A frame is a 16-byte header, little-endian, then ``size`` bytes of payload:

    size     u32   payload bytes
    call_id  u32   the gateway's number for the call, unique among its calls in
                   flight on the connection
    kind     u8    HELLO, CALL, REPLY or CANCEL
    arg      u8    CALL: the method's number (METHOD_NUMBERS, fixed, never reused);
                   REPLY, HELLO's answer: a gRPC status code (0 = OK)
    magic    u8    MAGIC (0xE5) on every frame: bytes that are not frames are refused
    version  u8    VERSION of the frame protocol the sender speaks
    timeout  u32   CALL: microseconds until the call's deadline (0: none);
                   REPLY: the error class the replica names (link/status.py's
                   ERROR_TABLE numbers; 0: none, as every frame before them sent)

Frames before version 1 had two zero bytes where magic and version are, so an old
peer reads as magic 0, version 0. The two ends must speak the same version: the
meaning of a method number, or of a header field, may change with it. VERSION goes
up with any change to the header, the method table or the meaning of a message.

A connection starts with the gateway's HELLO, whose payload is the replica token
(empty without one); the replica answers HELLO with OK and its instance id (the one
its ``Info`` reports), or UNAUTHENTICATED and closes the connection. A HELLO of
another version is answered FAILED_PRECONDITION (the details name both versions)
and the connection closed; the gateway checks the version of the answer too, so
a replica older than the check is caught on the gateway's side, before any CALL
(docs/replica-link.md). Then CALLs go one way and REPLYs the other, in any order, matched by
``call_id``: an OK reply's payload is the response message, any other its details in
UTF-8. CANCEL (no payload) tells the replica the caller has gone. A closed connection
fails every call in flight on it (UNAVAILABLE on the gateway's side).

A replica on the gateway's machine has its frame socket beside its gRPC socket
(``frame_socket_path``), so a gateway given ``unix:PATH`` finds it without another
flag; it is as private as the directory both are in. A replica reached at
``HOST:PORT`` listens for frames on TCP too (``--frame-port``), at the port its
``Info`` names, and the gateway connects to that port on the same host; the
instance id in HELLO's answer tells it the port leads to the process whose ``Info``
it read (not to another replica behind a load-balanced address).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path

import grpc
from google.protobuf.message import Message
from google.protobuf.message_factory import GetMessageClass

from embedserve.protos import inference_pb2

HEADER = struct.Struct("<IIBBBBI")
HELLO, CALL, REPLY, CANCEL = 1, 2, 3, 4
MAGIC = 0xE5
# Read at call time (``frames.VERSION``), never copied: a test speaks another version
# by setting it in a process of its own.
VERSION = 1
# The most a HELLO may carry (a replica token); nothing larger is read from a
# connection that has not said HELLO.
MAX_HELLO_BYTES = 4096
MAX_TIMEOUT_US = 2**32 - 1   # ~71 minutes; a longer timeout is sent as none
# The largest message a gateway takes from a replica, on either transport.
MAX_MESSAGE_BYTES = 256 * 1024 * 1024


@dataclass(frozen=True)
class Method:
    name: str
    request_type: type[Message]
    response_type: type


# The number a CALL names each embedserve.v1 Inference method by: fixed here, not taken
# from the proto's order (a method added or moved in the proto must not renumber the
# others); a number is never reused for another method. Pinned by tests/test_frames_version.py.
METHOD_NUMBERS = {"Embed": 1, "Score": 2, "Info": 3, "Ranges": 4, "Classify": 5, "EmbedSparse": 6,
                  "EmbedTokens": 7}
_SERVICE = inference_pb2.DESCRIPTOR.services_by_name["Inference"]
METHODS = {number: Method(name, GetMessageClass(_SERVICE.methods_by_name[name].input_type),
                          GetMessageClass(_SERVICE.methods_by_name[name].output_type))
           for name, number in METHOD_NUMBERS.items()}

STATUS_BY_NUMBER = {code.value[0]: code for code in grpc.StatusCode}


def frame_socket_path(grpc_socket: str | Path) -> Path:
    """Where a replica whose gRPC socket is ``grpc_socket`` listens for frames."""
    path = Path(grpc_socket)
    return path.with_name(path.name + ".frames")


def frame(kind: int, call_id: int, payload: bytes = b"", arg: int = 0, timeout_us: int = 0) -> bytes:
    """One frame, header and payload."""
    return HEADER.pack(len(payload), call_id, kind, arg, MAGIC, VERSION, timeout_us) + payload


def speaks_our_version(item: Frame) -> bool:
    """Whether ``item`` is a frame of the version this process speaks."""
    return item.magic == MAGIC and item.version == VERSION


def status_number(code: grpc.StatusCode) -> int:
    return code.value[0]


def status_code(number: int) -> grpc.StatusCode:
    """The gRPC status a frame carries; an unknown number reads as UNKNOWN."""
    return STATUS_BY_NUMBER.get(number, grpc.StatusCode.UNKNOWN)


@dataclass(frozen=True)
class Frame:
    kind: int
    call_id: int
    arg: int
    timeout_us: int
    payload: bytes
    oversized: bool = False   # payload over the reader's limit: dropped, ``payload`` empty
    magic: int = MAGIC
    version: int = 1


class FrameReader:
    """Cuts a byte stream into frames; frames over ``max_payload`` bytes are skipped.

    A skipped frame still comes out (``oversized``, empty payload) so the receiver
    can refuse that call and keep the connection.
    """

    def __init__(self, max_payload: int) -> None:
        self._max_payload = max_payload
        self._buffer = bytearray()
        self._skipping = 0      # bytes of an oversized payload still to drop

    def feed(self, data: bytes) -> list[Frame]:
        """The frames ``data`` completes, in order (a list, not a generator: the buffer is
        trimmed before the caller acts on any of them)."""
        if self._skipping:
            dropped = min(self._skipping, len(data))
            self._skipping -= dropped
            data = data[dropped:]
        self._buffer += data
        buffer = self._buffer
        found: list[Frame] = []
        start = 0
        while len(buffer) - start >= HEADER.size and not self._skipping:
            size, call_id, kind, arg, magic, version, timeout_us = HEADER.unpack_from(buffer, start)
            body = start + HEADER.size
            if size > self._max_payload:
                present = min(size, len(buffer) - body)
                self._skipping = size - present
                start = body + present
                found.append(Frame(kind, call_id, arg, timeout_us, b"", True, magic, version))
                continue
            if len(buffer) - body < size:
                break
            start = body + size
            found.append(Frame(kind, call_id, arg, timeout_us, bytes(buffer[body:start]), False,
                               magic, version))
        del buffer[:start]
        return found
