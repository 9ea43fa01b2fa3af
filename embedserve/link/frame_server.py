"""The replica's frame socket: ``embedserve.link.frames`` calls served by the same handlers.

Each CALL runs the replica's ``InferenceService`` handler of its method as its own task,
exactly as grpc.aio would (same decoding, validation, admission, errors and metrics);
only the envelope differs. ``CallContext`` stands in for the handler's gRPC context:
the deadline the frame carries, and the status the handler sets.

Life cycle follows the gRPC server's: ``stop`` stops accepting, lets calls in flight
finish for ``grace_s`` (a draining replica has already stopped admitting new ones),
then cancels the rest and closes the connections, which fails those calls on the
gateway's side as UNAVAILABLE (retried on another replica).

Bounded for a peer that is not a gateway (docs/replica-link.md): at most
``max_connections`` connections; before HELLO a connection holds at most one header
and ``frames.MAX_HELLO_BYTES``, and is closed unless HELLO is done within
``handshake_timeout_s``; a HELLO of another frame version is refused; a call id
reused while its call is in flight closes the connection. Write backpressure: a
connection whose replies wait unsent past ``write_buffer_high`` bytes (16 MiB) is not
read (so no new call of its is started) until its peer has read them down to
``write_buffer_low``; a peer that never reads holds at most that, plus the replies of
its calls already running (which the replica's queue bounds), and its sends block in
its own kernel buffers.
"""

from __future__ import annotations

import asyncio
import hmac
import inspect
import logging
import time
from pathlib import Path
from typing import Protocol, cast

import grpc
from google.protobuf.message import DecodeError

from embedserve.link import frames
from embedserve.link.status import INTERNAL_MESSAGE, error_number

log = logging.getLogger(__name__)

# Unsent reply bytes at which a connection stops being read, and back under which it is
# read again (its transport's write buffer limits). Far above what a gateway that
# reads leaves unsent, so a gateway is never slowed by them.
WRITE_BUFFER_HIGH = 16 * 1024 * 1024
WRITE_BUFFER_LOW = 4 * 1024 * 1024


class FrameService(Protocol):
    """What the frame server serves: the replica's ``embedserve.v1.Inference`` handlers
    (``scheduler/servicer.py``'s ``InferenceService``), each method by its name,
    ``async def Embed(request, context)``."""

    instance_id: str

    def count_cancelled_before_start(self, method: str) -> None: ...


class CallContext:
    """What a handler asks of its context: the time left, and the status it sets."""

    # One read hands over every frame that arrived, so a call's steps may run on the
    # loop (scheduler/batcher.py).
    reads_calls_in_bulk = True

    def __init__(self, deadline: float | None) -> None:
        self._deadline = deadline
        self.code: grpc.StatusCode | None = None
        self.details = ""
        self.trailing_metadata: tuple[tuple[str, str], ...] = ()

    def time_remaining(self) -> float | None:
        return None if self._deadline is None else self._deadline - time.monotonic()

    def set_code(self, code: grpc.StatusCode) -> None:
        self.code = code

    def set_details(self, details: str) -> None:
        self.details = details

    def set_trailing_metadata(self, metadata: tuple[tuple[str, str], ...]) -> None:
        # Only the error's class is read from it (a REPLY's number, status.error_number).
        self.trailing_metadata = metadata


class FrameServer:
    """Serves ``service`` on a Unix socket, a TCP port, or both. ``max_payload``: the
    largest request, in bytes (the gRPC server's receive limit); ``max_calls``: calls
    at once, over all connections (the gRPC server's ``maximum_concurrent_rpcs``)."""

    def __init__(self, service: FrameService, token: str | None, max_payload: int,
                 max_calls: int, max_connections: int = 256, handshake_timeout_s: float = 5.0,
                 write_buffer_high: int = WRITE_BUFFER_HIGH, write_buffer_low: int = WRITE_BUFFER_LOW) -> None:
        self.service = service
        self._token = (token or "").encode()
        self.max_payload = max_payload
        self.max_calls = max_calls
        self.max_connections = max_connections
        self.handshake_timeout_s = handshake_timeout_s
        self.write_buffer_limits = {"high": write_buffer_high, "low": write_buffer_low}
        self._servers: list[asyncio.AbstractServer] = []
        self.connections: set[_Connection] = set()
        self.calls: set[asyncio.Task] = set()

    async def start_unix(self, path: Path) -> None:
        loop = asyncio.get_running_loop()
        self._servers.append(await loop.create_unix_server(lambda: _Connection(self), str(path)))

    async def start_tcp(self, host: str, port: int) -> int:
        """Listen on ``host:port`` (0: a free port); return the port bound."""
        loop = asyncio.get_running_loop()
        server = await loop.create_server(lambda: _Connection(self), host, port)
        self._servers.append(server)
        return server.sockets[0].getsockname()[1]

    async def stop(self, grace_s: float) -> None:
        if not self._servers:
            return
        for server in self._servers:
            server.close()
        if self.calls:
            await asyncio.wait(list(self.calls), timeout=grace_s)
        for task in list(self.calls):
            task.cancel()
        for connection in list(self.connections):
            connection.close()
        for server in self._servers:
            await server.wait_closed()

    def token_matches(self, supplied: bytes) -> bool:
        # Constant time: the comparison must not tell a prober how much of a guess was right.
        return hmac.compare_digest(supplied, self._token)


class _Connection(asyncio.Protocol):
    def __init__(self, server: FrameServer) -> None:
        self._server = server
        self._reader = frames.FrameReader(server.max_payload)
        self._transport: asyncio.Transport | None = None
        self._greeted = False
        self._unread = bytearray()   # before HELLO: at most a header and MAX_HELLO_BYTES
        self._timer: asyncio.TimerHandle | None = None   # the handshake deadline
        self._calls: dict[int, tuple[asyncio.Task, str]] = {}   # call id -> (task, method)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = writer = cast(asyncio.Transport, transport)   # a stream socket's transport
        if len(self._server.connections) >= self._server.max_connections:
            log.warning("refused a frame connection: already %d open (--max-frame-connections)",
                        len(self._server.connections))
            transport.close()
            return
        self._server.connections.add(self)
        writer.set_write_buffer_limits(**self._server.write_buffer_limits)
        self._timer = asyncio.get_running_loop().call_later(
            self._server.handshake_timeout_s, self._handshake_expired)

    def connection_lost(self, exc: Exception | None) -> None:
        self._server.connections.discard(self)
        if self._timer is not None:
            self._timer.cancel()
        for task, _ in self._calls.values():   # the gateway is gone: nobody awaits these
            task.cancel()
        self._transport = None

    def close(self) -> None:
        if self._transport is not None:
            self._transport.close()

    def _handshake_expired(self) -> None:
        log.warning("closed a frame connection that did not say HELLO within %.0f s",
                    self._server.handshake_timeout_s)
        self.close()

    def pause_writing(self) -> None:
        # Unsent replies passed WRITE_BUFFER_HIGH: read no more calls until they drain.
        if self._transport is not None and not self._transport.is_closing():
            log.debug("a frame connection's peer is not reading its replies: not reading it")
            self._transport.pause_reading()

    def resume_writing(self) -> None:
        if self._transport is not None and not self._transport.is_closing():
            self._transport.resume_reading()

    def data_received(self, data: bytes) -> None:
        if not self._greeted:
            data = self._hello(data)
            if not data:
                return
        for item in self._reader.feed(data):
            if not frames.speaks_our_version(item):
                log.warning("closed a frame connection: a frame without the magic or of "
                            "version %d", item.version)
                self.close()
                return
            if item.kind == frames.CALL:
                self._start_call(item)
            elif item.kind == frames.CANCEL:
                self._cancel(item.call_id)

    def _hello(self, data: bytes) -> bytes:
        """Gather the HELLO (it must come first, whole within a header and MAX_HELLO_BYTES)
        and answer it; the bytes after it, if it was accepted (else b"")."""
        self._unread += data
        if len(self._unread) < frames.HEADER.size:
            return b""
        size, call_id, kind, _, magic, version, _ = frames.HEADER.unpack_from(self._unread)
        # Magic and version 0: a gateway of a release before versions (padding there).
        if (magic == frames.MAGIC or (magic, version) == (0, 0)) and version != frames.VERSION:
            log.warning("refused a frame connection: it speaks frame version %d, this replica "
                        "version %d (a gateway of another release; it calls over gRPC)",
                        version, frames.VERSION)
            self._refuse(call_id, grpc.StatusCode.FAILED_PRECONDITION,
                         f"frame version {version} is not this replica's version {frames.VERSION}; "
                         "call it over gRPC")
            return b""
        if magic != frames.MAGIC or kind != frames.HELLO or size > frames.MAX_HELLO_BYTES:
            log.warning("refused a frame connection: its first frame is not an embedserve HELLO")
            self._refuse(call_id, grpc.StatusCode.INVALID_ARGUMENT,
                         f"the first frame must be a HELLO of at most {frames.MAX_HELLO_BYTES} bytes")
            return b""
        end = frames.HEADER.size + size
        if len(self._unread) < end:
            return b""
        token, rest = bytes(self._unread[frames.HEADER.size:end]), bytes(self._unread[end:])
        self._unread = bytearray()
        if not self._server.token_matches(token):
            log.warning("refused a frame connection: missing or wrong replica token")
            self._refuse(call_id, grpc.StatusCode.UNAUTHENTICATED,
                         "missing or wrong replica token; see --replica-token-file")
            return b""
        self._greeted = True
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        # Answered with the id Info reports: the gateway checks both lead to one process.
        self._reply(call_id, grpc.StatusCode.OK, self._server.service.instance_id.encode(),
                    kind=frames.HELLO)
        return rest

    def _refuse(self, call_id: int, code: grpc.StatusCode, details: str) -> None:
        self._reply(call_id, code, details.encode(), kind=frames.HELLO)
        self._unread = bytearray()
        self.close()

    def _cancel(self, call_id: int) -> None:
        """The gateway gave up on a call: stop its task. A CANCEL read in the same batch
        of frames as its CALL finds the task not yet begun, so its handler never sees the
        cancellation; it is counted here instead."""
        entry = self._calls.get(call_id)
        if entry is None:
            return
        task, method = entry
        if inspect.getcoroutinestate(task.get_coro()) == inspect.CORO_CREATED:  # type: ignore[arg-type]  # a coroutine
            self._server.service.count_cancelled_before_start(method)
        task.cancel()

    def _start_call(self, call: frames.Frame) -> None:
        if call.oversized:
            self._reply(call.call_id, grpc.StatusCode.RESOURCE_EXHAUSTED,
                        f"request larger than this replica's limit of {self._server.max_payload} "
                        f"bytes".encode())
            return
        method = frames.METHODS.get(call.arg)
        if method is None:
            self._reply(call.call_id, grpc.StatusCode.UNIMPLEMENTED, b"unknown method")
            return
        if call.call_id in self._calls:
            # Replies are matched by id: a peer that reuses one in flight cannot tell its
            # answers apart, nor have the earlier call cancelled. Closing cancels them all.
            log.warning("closed a frame connection that reused call id %d while in flight",
                        call.call_id)
            self.close()
            return
        if len(self._server.calls) >= self._server.max_calls:
            self._reply(call.call_id, grpc.StatusCode.RESOURCE_EXHAUSTED,
                        b"the replica is serving its maximum of concurrent calls")
            return
        task = asyncio.get_running_loop().create_task(self._serve(call))
        self._calls[call.call_id] = (task, method.name)
        self._server.calls.add(task)
        task.add_done_callback(lambda done: self._forget(call.call_id, done))

    def _forget(self, call_id: int, task: asyncio.Task) -> None:
        entry = self._calls.get(call_id)
        if entry is not None and entry[0] is task:
            del self._calls[call_id]
        self._server.calls.discard(task)

    async def _serve(self, call: frames.Frame) -> None:
        method = frames.METHODS[call.arg]
        timeout = call.timeout_us / 1e6 if call.timeout_us else None
        context = CallContext(None if timeout is None else time.monotonic() + timeout)
        try:
            request = method.request_type.FromString(call.payload)
        except DecodeError:
            self._reply(call.call_id, grpc.StatusCode.INVALID_ARGUMENT,
                        f"cannot decode the {method.name} request".encode())
            return
        handler = getattr(self._server.service, method.name)
        try:
            async with asyncio.timeout(timeout):
                response = await handler(request, context)
        except TimeoutError:
            self._reply(call.call_id, grpc.StatusCode.DEADLINE_EXCEEDED, b"deadline exceeded")
            return
        except Exception:  # the handlers map their own errors; this is a bug, not a bad call
            log.exception("frame call %s failed", method.name)
            self._reply(call.call_id, grpc.StatusCode.INTERNAL, INTERNAL_MESSAGE.encode())
            return
        if context.code is not None and context.code is not grpc.StatusCode.OK:
            self._reply(call.call_id, context.code, context.details.encode(),
                        error=error_number(context.trailing_metadata))
            return
        self._reply(call.call_id, grpc.StatusCode.OK, response.SerializeToString())

    def _reply(self, call_id: int, code: grpc.StatusCode, payload: bytes,
               kind: int = frames.REPLY, error: int = 0) -> None:
        if self._transport is not None and not self._transport.is_closing():
            self._transport.write(frames.frame(kind, call_id, payload, arg=frames.status_number(code),
                                               timeout_us=error))
