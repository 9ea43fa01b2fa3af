"""The gateway's end of a replica's frame socket (``embedserve.link.frames``).

One connection per replica carries all of the gateway's calls to it, matched by
call id. ``call`` raises ``ReplicaCallError``, which answers ``code()`` and
``details()`` as grpc.aio's ``AioRpcError`` does, so the dispatcher treats both
transports' failures alike. A deadline that passes, or a caller that is cancelled,
sends CANCEL so the replica drops the call too; a connection that closes fails
every call in flight on it with UNAVAILABLE.

No flow control beyond the socket's: the replica pool already bounds the tokens
outstanding per replica, and so the bytes waiting in this connection's buffer.

A TCP connection is watched by the kernel (``keepalive_s``): keepalive probes while
it is quiet, and a limit on how long sent bytes may go unacknowledged. A connection
dropped on the way (a NAT or conntrack entry expired, a firewall that discards)
otherwise looks open forever: the replica's gRPC connection beside it, kept alive by
its HTTP/2 pings, says the replica serves, and every call sent here would wait for its
deadline. The probes also keep such an entry from expiring. The kernel answers them
on the replica's side, so a replica busy computing a long step is not taken for lost.
"""

from __future__ import annotations

import asyncio
import math
import socket
from pathlib import Path

import grpc
from google.protobuf.message import DecodeError, Message

from embedserve.link import frames
from embedserve.link.status import metadata_of_number

# A replica's frame socket: the path of a Unix socket, or a TCP (host, port).
FrameTarget = Path | tuple[str, int]


class ReplicaCallError(Exception):
    """A frame call that ended without an answer: its gRPC status and details."""

    def __init__(self, code: grpc.StatusCode, details: str, error_number: int = 0) -> None:
        super().__init__(f"{code.name}: {details}")
        self._code = code
        self._details = details
        self._error_number = error_number   # the class the replica named (status.ERROR_TABLE)

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return self._details

    def trailing_metadata(self) -> tuple[tuple[str, str], ...]:
        """The class the replica named, as gRPC carries it."""
        return metadata_of_number(self._error_number)


def watch_by_keepalive(sock: socket.socket, period_s: float) -> None:
    """Have the kernel close ``sock`` once its peer has acknowledged nothing for about
    ``2 * period_s``: a probe after ``period_s`` of quiet, and unacknowledged data
    given as long. Linux socket options; elsewhere only SO_KEEPALIVE's defaults."""
    period = max(1, math.ceil(period_s))   # the probe options count whole seconds
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    if hasattr(socket, "TCP_USER_TIMEOUT"):
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE, period)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL, period)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT, 1)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT, int(2000 * period_s))


class FrameVersionMismatch(ReplicaCallError):
    """FAILED_PRECONDITION: the replica speaks another frame version (a rolling upgrade
    mixes releases); the gateway calls it over gRPC, whose calls name their methods."""


class FrameConnectionLost(ReplicaCallError):
    """UNAVAILABLE: the frame connection closed with the call unanswered. The
    replica itself may serve on: its gRPC channel is watched on its own."""


class FrameChannel(asyncio.Protocol):
    """A connection to one replica's frame socket. Open with ``FrameChannel.open``."""

    def __init__(self, max_payload: int) -> None:
        self._reader = frames.FrameReader(max_payload)
        self._transport: asyncio.Transport | None = None
        self._pending: dict[int, tuple[asyncio.Future, type[Message] | None]] = {}
        self._next_id = 0
        self._lost = "the connection to the replica closed"
        self._lost_event = asyncio.Event()

    @classmethod
    async def open(cls, target: FrameTarget, token: str | None, timeout_s: float,
                   instance_id: str = "", max_payload: int = frames.MAX_MESSAGE_BYTES,
                   keepalive_s: float = 0.0) -> FrameChannel:
        """Connect to a Unix socket's path or a ``(host, port)`` and say HELLO.

        ``keepalive_s`` (TCP only; 0: off): a quiet connection is probed every
        ``keepalive_s``, and closed once nothing has been acknowledged for twice that,
        which fails its calls in flight as UNAVAILABLE.

        ReplicaCallError if the replica refuses the token, or (``instance_id``
        given) if it is not the process whose Info reported that id;
        FrameVersionMismatch if either end finds the other's frame version is not its
        own; OSError if nothing listens there.
        """
        loop = asyncio.get_running_loop()
        async with asyncio.timeout(timeout_s):
            if isinstance(target, tuple):
                transport, channel = await loop.create_connection(lambda: cls(max_payload), *target)
                if keepalive_s > 0:
                    watch_by_keepalive(transport.get_extra_info("socket"), keepalive_s)
            else:
                _, channel = await loop.create_unix_connection(lambda: cls(max_payload), str(target))
            try:
                answered = await channel._exchange(frames.HELLO, 0, (token or "").encode(), None)
                if instance_id and answered != instance_id.encode():
                    raise ReplicaCallError(grpc.StatusCode.FAILED_PRECONDITION,
                                           "another replica process answers there than the one "
                                           "whose Info named it")
            except BaseException:
                channel.close()
                raise
        return channel

    @property
    def closed(self) -> bool:
        return self._transport is None or self._transport.is_closing()

    def close(self) -> None:
        if self._transport is not None:
            self._transport.close()

    async def wait_lost(self) -> None:
        """Return once the connection has closed, from either end."""
        await self._lost_event.wait()

    async def call(self, method: str, request: Message, timeout: float | None) -> Message:
        """``method``'s response to ``request``; ReplicaCallError on any other outcome."""
        number = frames.METHOD_NUMBERS[method]
        timeout_us = 0 if timeout is None else max(1, int(timeout * 1e6))
        if timeout_us > frames.MAX_TIMEOUT_US:
            timeout_us = 0
        return await self._exchange(frames.CALL, number, request.SerializeToString(),
                                    frames.METHODS[number].response_type, timeout, timeout_us)

    async def _exchange(self, kind: int, arg: int, payload: bytes, response_type: type[Message] | None,
                        timeout: float | None = None, timeout_us: int = 0) -> Message | bytes:
        if self.closed:
            raise FrameConnectionLost(grpc.StatusCode.UNAVAILABLE, self._lost)
        call_id = self._next_id
        self._next_id = (self._next_id + 1) & 0xFFFFFFFF
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        self._pending[call_id] = (future, response_type)
        self._transport.write(frames.frame(kind, call_id, payload, arg=arg, timeout_us=timeout_us))  # type: ignore[union-attr]  # not closed
        # A timer that fails the future, not asyncio.timeout: no cancellation of this
        # task to undo, and a few microseconds less on every call.
        timer = None if timeout is None else loop.call_later(timeout, self._expire, call_id)
        try:
            return await future
        except asyncio.CancelledError:
            self._abandon(call_id)
            raise
        finally:
            if timer is not None:
                timer.cancel()

    def _expire(self, call_id: int) -> None:
        """The call's deadline passed unanswered: fail it, and tell the replica."""
        entry = self._pending.get(call_id)
        if entry is not None and not entry[0].done():
            self._abandon(call_id)
            entry[0].set_exception(ReplicaCallError(grpc.StatusCode.DEADLINE_EXCEEDED,
                                                    "deadline exceeded"))

    def _abandon(self, call_id: int) -> None:
        """The caller no longer waits: tell the replica, unless the answer is in."""
        if self._pending.pop(call_id, None) is not None and not self.closed:
            self._transport.write(frames.frame(frames.CANCEL, call_id))  # type: ignore[union-attr]  # not closed

    def _refuse_version(self, reply: frames.Frame) -> None:
        """A frame of another version (or not a frame): no call of ours may be read from
        it. Fail every call in flight with FrameVersionMismatch, and close."""
        details = (f"the replica speaks frame version {reply.version}, this gateway "
                   f"version {frames.VERSION}" if reply.magic == frames.MAGIC else
                   "the replica's answer is not an embedserve frame (a release before frame "
                   f"version 1, or another service); this gateway speaks version {frames.VERSION}")
        pending, self._pending = self._pending, {}
        for future, _ in pending.values():
            if not future.done():
                future.set_exception(FrameVersionMismatch(grpc.StatusCode.FAILED_PRECONDITION,
                                                          details))
        self.close()

    # -- asyncio.Protocol ----------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport  # type: ignore[assignment]

    def connection_lost(self, exc: Exception | None) -> None:
        self._transport = None
        if exc is not None:
            self._lost = f"{self._lost}: {exc}"
        self._lost_event.set()
        pending, self._pending = self._pending, {}
        for future, _ in pending.values():
            if not future.done():
                future.set_exception(FrameConnectionLost(grpc.StatusCode.UNAVAILABLE, self._lost))

    def data_received(self, data: bytes) -> None:
        for reply in self._reader.feed(data):
            if not frames.speaks_our_version(reply):
                self._refuse_version(reply)
                return
            entry = self._pending.pop(reply.call_id, None)
            if entry is None or entry[0].done():
                continue   # abandoned by its caller
            future, response_type = entry
            code = frames.status_code(reply.arg)
            if reply.oversized:
                future.set_exception(ReplicaCallError(
                    grpc.StatusCode.RESOURCE_EXHAUSTED, "the replica's answer is over the gateway's limit"))
            elif code is not grpc.StatusCode.OK:
                details = reply.payload.decode(errors="replace")
                error = (FrameVersionMismatch if response_type is None
                         and code is grpc.StatusCode.FAILED_PRECONDITION
                         and details.startswith("frame version") else ReplicaCallError)
                future.set_exception(error(code, details, reply.timeout_us))
            elif response_type is None:   # HELLO: the replica's instance id
                future.set_result(reply.payload)
            else:
                try:
                    future.set_result(response_type.FromString(reply.payload))
                except DecodeError:
                    future.set_exception(ReplicaCallError(grpc.StatusCode.INTERNAL,
                                                          "cannot decode the replica's answer"))
