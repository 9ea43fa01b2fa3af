"""The gateway's HTTP protocol: a response's head and body leave in one write.

``WriteJoiningTransport`` on a recording transport (what reaches the socket,
write by write), then uvicorn with ``JoinedWritesHttpProtocol`` on 127.0.0.1
answering a raw socket: the exchanges where a held write must not wait for
another (``100 Continue``, HEAD, a streamed body) and the response split.
"""

from __future__ import annotations

import asyncio
import socket
import threading
import time

import pytest
import uvicorn

from embedserve.gateway.cli import listening_socket
from embedserve.gateway.http_protocol import WriteJoiningTransport, gateway_uvicorn_config


class RecordingTransport:
    """What a transport was asked to send, one entry per call that reaches the socket."""

    def __init__(self) -> None:
        self.sent: list[bytes] = []
        self.closed = False
        self.aborted = False

    def write(self, data: bytes) -> None:
        self.sent.append(bytes(data))

    def writelines(self, lines) -> None:
        self.sent.append(b"".join(lines))

    def is_closing(self) -> bool:
        return self.closed or self.aborted

    def close(self) -> None:
        self.closed = True

    def abort(self) -> None:
        self.aborted = True

    def get_extra_info(self, name: str, default=None):
        return {"peername": ("127.0.0.1", 1234)}.get(name, default)


def joined(coroutine_fn):
    """Run ``coroutine_fn(transport, recording)`` on a fresh event loop."""
    async def main():
        recording = RecordingTransport()
        await coroutine_fn(WriteJoiningTransport(recording, asyncio.get_running_loop()), recording)
    asyncio.run(main())


def test_head_and_body_leave_in_one_send():
    async def check(transport, recording):
        transport.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n")
        assert recording.sent == []
        transport.write(b"{}")
        assert recording.sent == [b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n{}"]
        await asyncio.sleep(0)
        assert len(recording.sent) == 1   # the end of the turn sends nothing more
    joined(check)


def test_a_write_no_other_follows_leaves_at_the_end_of_the_turn():
    async def check(transport, recording):
        transport.write(bytearray(b"HTTP/1.1 100 Continue\r\n\r\n"))
        assert recording.sent == []
        await asyncio.sleep(0)
        assert recording.sent == [b"HTTP/1.1 100 Continue\r\n\r\n"]
        transport.write(b"a")
        transport.write(b"b")
        transport.write(b"c")
        await asyncio.sleep(0)
        assert recording.sent[1:] == [b"ab", b"c"]
    joined(check)


def test_close_sends_the_held_write_first_and_abort_drops_it():
    async def check(transport, recording):
        transport.write(b"last words")
        transport.close()
        assert recording.sent == [b"last words"] and recording.closed
        await asyncio.sleep(0)
        assert recording.sent == [b"last words"]
    joined(check)

    async def check_abort(transport, recording):
        transport.write(b"never sent")
        transport.abort()
        await asyncio.sleep(0)
        assert recording.sent == [] and recording.aborted
    joined(check_abort)


def test_everything_else_is_the_wrapped_transports():
    async def check(transport, recording):
        assert transport.get_extra_info("peername") == ("127.0.0.1", 1234)
        assert transport.is_closing() is False
        recording.closed = True
        transport.write(b"late")
        await asyncio.sleep(0)
        assert recording.sent == []   # nothing is written to a closing transport
    joined(check)


async def echo_app(scope, receive, send):
    """Answers a POST with its body, ``/stream`` in two chunks a moment apart."""
    if scope["type"] != "http":
        return
    body = b""
    while True:
        message = await receive()
        body += message.get("body", b"")
        if not message.get("more_body"):
            break
    if scope["path"] == "/stream":
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"text/plain")]})
        await send({"type": "http.response.body", "body": b"first ", "more_body": True})
        await asyncio.sleep(0.05)
        await send({"type": "http.response.body", "body": b"second"})
        return
    answer = body or b"hello"
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-type", b"text/plain"),
                            (b"content-length", str(len(answer)).encode())]})
    await send({"type": "http.response.body", "body": answer})


@pytest.fixture(scope="module")
def echo_server():
    sock = listening_socket("127.0.0.1", 0)
    server = uvicorn.Server(gateway_uvicorn_config(echo_app, log_level="warning"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "the server did not start"
        time.sleep(0.02)
    yield sock.getsockname()[1]
    server.should_exit = True
    thread.join(30)


def read_until(conn: socket.socket, marker: bytes, buffer: bytes = b"") -> bytes:
    while marker not in buffer:
        chunk = conn.recv(65536)
        assert chunk, f"the connection closed before {marker!r}; got {buffer!r}"
        buffer += chunk
    return buffer


def test_100_continue_is_sent_before_the_body_arrives(echo_server):
    # curl sends Expect: 100-continue with bodies over 1 KB and waits for this line:
    # a held write nobody joins must still go out.
    body = b"x" * 2048
    with socket.create_connection(("127.0.0.1", echo_server), timeout=10) as conn:
        conn.sendall(b"POST /echo HTTP/1.1\r\nHost: t\r\nContent-Type: text/plain\r\n"
                     b"Expect: 100-continue\r\nContent-Length: %d\r\n\r\n" % len(body))
        interim = read_until(conn, b"\r\n\r\n")
        assert interim.startswith(b"HTTP/1.1 100 Continue\r\n")
        conn.sendall(body)
        reply = read_until(conn, b"\r\n\r\n", interim.split(b"\r\n\r\n", 1)[1])
        head, _, rest = reply.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200 OK")
        assert read_until(conn, body, rest) == body


def test_head_streamed_and_keep_alive_answers_arrive_whole(echo_server):
    with socket.create_connection(("127.0.0.1", echo_server), timeout=10) as conn:
        conn.sendall(b"HEAD /echo HTTP/1.1\r\nHost: t\r\n\r\n")
        head = read_until(conn, b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200 OK") and head.endswith(b"\r\n\r\n")
        conn.sendall(b"POST /stream HTTP/1.1\r\nHost: t\r\nContent-Length: 0\r\n\r\n")
        streamed = read_until(conn, b"0\r\n\r\n")
        assert b"transfer-encoding: chunked" in streamed
        assert b"first " in streamed and b"second" in streamed
        for text in (b"one", b"two"):  # the same connection answers again
            conn.sendall(b"POST /echo HTTP/1.1\r\nHost: t\r\nContent-Length: 3\r\n\r\n" + text)
            assert read_until(conn, text).endswith(text)
