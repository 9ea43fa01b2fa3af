"""uvicorn's httptools protocol, with a response's head and body sent in one write.

uvicorn writes a response's status line and headers when the app sends
``http.response.start`` and its body in a second write when the app sends
``http.response.body``. With Nagle off (as it must be for latency) that is
two TCP segments for an answer that fits in one, and a client woken twice
(BENCHMARKS.md, Gateway, "The response head and body in one write").
``WriteJoiningTransport`` holds a write until the next one on the same
connection and sends both together; a write that no other follows in the
same turn of the event loop (a HEAD answer's head, ``100 Continue``, a
streamed body's chunk) leaves at the end of that turn, so nothing waits on it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable

import uvicorn
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

# Up to this size a body is joined to the held head by copying (cheaper than a list of
# buffers); beyond it, handed over as a second buffer of the same send.
_JOIN_BYTES = 64 * 1024


class WriteJoiningTransport:
    """Wraps a transport: each write is held until the next write, which joins it, or
    until the loop's current turn ends. Everything else is the wrapped transport's."""

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        self._transport = transport
        self._loop = loop
        self._held: bytes | None = None

    def write(self, data: bytes | bytearray | memoryview) -> None:
        held = self._held
        if held is None:
            if data:
                # A copy only of what a caller could still change.
                self._held = data if isinstance(data, bytes) else bytes(data)
                self._loop.call_soon(self._send_held)
            return
        self._held = None
        if len(data) <= _JOIN_BYTES:
            self._transport.write(held + data)
        else:   # one send still (uvloop writes a list of buffers with one writev), no copy
            self._transport.writelines((held, data))

    def writelines(self, lines: Iterable[bytes | bytearray | memoryview]) -> None:
        self.write(b"".join(lines))

    def write_eof(self) -> None:
        self._send_held()
        self._transport.write_eof()

    def close(self) -> None:
        self._send_held()
        self._transport.close()

    def abort(self) -> None:
        self._held = None
        self._transport.abort()

    def _send_held(self) -> None:
        held, self._held = self._held, None
        if held is not None and not self._transport.is_closing():
            self._transport.write(held)

    def __getattr__(self, name: str):
        return getattr(self._transport, name)


class JoinedWritesHttpProtocol(HttpToolsProtocol):
    """uvicorn's ``http="httptools"`` protocol on a ``WriteJoiningTransport``."""

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(WriteJoiningTransport(transport, self.loop))  # type: ignore[arg-type]


def gateway_uvicorn_config(app, **options) -> uvicorn.Config:
    """uvicorn's settings for serving the gateway app: this protocol, no access log.

    httptools is named rather than left to uvicorn's "auto": h11's pure-Python
    parser cost ~0.1 ms more gateway CPU per request, and a missing httptools
    should fail at start, not quietly serve slower."""
    return uvicorn.Config(app, http=JoinedWritesHttpProtocol, access_log=False, **options)
