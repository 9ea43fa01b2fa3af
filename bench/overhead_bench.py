"""Stack overhead: what the gateway, gRPC and the scheduler add to a short query's compute.

    python -m bench overhead [--iterations 400] [--text "..."] [--client raw|http.client|httpx]
                             [--pause-ms MS] [--stack "DIR [VAR=VALUE ...] [--FLAG ...]" ...]
                             [-- SERVE FLAGS]

Starts ``embedserve serve --port 0`` (default model and settings unless flags
follow ``--``) once per ``--stack``: a source tree put first on PYTHONPATH
(default: this checkout), optionally followed by environment variables and
extra serve flags for that stack alone (``--stack ". GOMP_SPINCOUNT=300000"``,
``--stack ". --replica-transport tcp"``). Then it sends the same one-sentence query as
``POST /v1/embeddings`` over one keep-alive connection, one request at a time, to
each stack in turn in blocks of ``--block`` requests, so background load on a shared
machine hits every stack alike (``--stack /work/main --stack .`` is a before/after in
one run). ``--pause-ms 50`` sleeps that long before each measured request: sporadic
queries, which find the stack's threads asleep (its OpenMP workers past their spin).

The client (``--client raw``, default) is a bare socket with TCP_NODELAY that sends
each request in one write, as curl, Go's net/http and hyper do for a small body: the
overhead is the stack's, so the client should add as little as a client can. The
standard library's ``http.client`` (``--client http.client``) writes the head and the
body separately, which wakes the server twice per request; httpx (``--client httpx``)
also spends about 1.1 ms more of the client's own time per request on this machine
(BENCHMARKS.md, "Stack overhead per hop"). Earlier runs counted both as overhead.

Reports per stack: client p50/p99, the engine compute p50 (Server-Timing
``inference``), overhead p50 (the per-request client time minus its
``inference``: the issue's target is <= 1.5 ms), and the p50 of every
Server-Timing entry the stack sends, plus ``outside`` (client time minus the
gateway's ``total``: the HTTP client, the socket and uvicorn's parse/write),
and the CPU time per request of the gateway process and of its replicas
(``/proc``: user + system, all threads), and where the tail comes from (the
requests at or above the client's p99: their median inference, gateway and hop,
and outside time, and in how many bursts they came: requests less than a second apart
are one burst, so a count far below the requests' says the tail is a few spells in which
the whole machine ran slow, every stage of both processes at once, as a shared VM host's
phases make it, rather than something a request meets on its own). CPU time hardly
depends on how busy
the machine is, so it compares stacks where wall times are noise; a replica's
CPU beyond its compute is its event loop, gRPC, and OpenMP threads spinning.
The entries a stack may send, in request order:

    parse      middleware entry -> route handler (body read, JSON + pydantic)
    tokenize   prompt + tokenization, with its executor hop
    dispatch   packing, chunking, replica choice, protobuf build (gateway)
    rpc        the gRPC call as the gateway awaits it (replica time included)
    replica    the replica's handler: decode, admit, wait for rows, post-process
    queue      waiting for a replica and in its queue
    wake       engine result ready -> its awaiting task runs (thread -> loop hop)
    inference  engine compute as the replica's loop sees it
    encode     response JSON
    total      the gateway's middleware, first byte in -> response start
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import socket
import sys
import time
import urllib.parse
from pathlib import Path

import httpx
import numpy as np

from embedserve.entrypoint import GATEWAY_LISTENING
from embedserve.launch.processes import popen_listening, stop_popen
from embedserve.process_children import living_children

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_TEXT = "How do I reset my password if I no longer have access to my email?"


def cpu_seconds(pid: int) -> float:
    """User + system CPU of process ``pid`` (all its threads) so far; 0 once it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def child_pids(pid: int) -> list[int]:
    """Process ``pid``'s living children."""
    return sorted(living_children(pid))


# In the command line of the child that compiles a tokenizer's native kernels
# (embedserve/tokenizer/warm.py's compile_command), which a gateway starts when a tree
# serves a model for the first time (gateway/startup.py).
_COMPILING_TOKENIZER = b"embedserve.tokenizer.warm"


def compiling_tokenizer(pid: int) -> bool:
    """Whether a child of process ``pid`` is compiling a tokenizer's native kernels."""
    for child in child_pids(pid):
        try:
            if _COMPILING_TOKENIZER in Path(f"/proc/{child}/cmdline").read_bytes():
                return True
        except OSError:
            pass
    return False


def parse_server_timing(header: str) -> dict[str, float]:
    """``tokenize;dur=1.200, queue;dur=0.050`` -> {"tokenize": 1.2, "queue": 0.05} (ms)."""
    timing: dict[str, float] = {}
    for part in header.split(","):
        name, _, rest = part.strip().partition(";")
        if rest.startswith("dur="):
            timing[name] = float(rest[4:])
    return timing


class LeanClient:
    """One keep-alive HTTP/1.1 connection (``http.client``), Nagle off as in the gateway."""

    def __init__(self, url: str) -> None:
        parts = urllib.parse.urlsplit(url)
        self._connection = http.client.HTTPConnection(parts.hostname, parts.port, timeout=60)

    def request(self, method: str, path: str, body: bytes | None = None) -> tuple[int, str]:
        """(status, Server-Timing header) of one request; the body is read whole."""
        if self._connection.sock is None:
            self._connection.connect()
            self._connection.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        headers = {"Content-Type": "application/json"} if body is not None else {}
        self._connection.request(method, path, body=body, headers=headers)
        reply = self._connection.getresponse()
        reply.read()
        return reply.status, reply.getheader("server-timing") or ""

    def close(self) -> None:
        self._connection.close()


class RawClient:
    """One keep-alive HTTP/1.1 connection on a bare socket: each request leaves in one write.

    ``http.client`` writes the head and the body in two ``send`` calls, so with Nagle
    off (as it must be for latency) the server wakes twice per request; curl, Go's
    net/http and hyper send a small request in one write. Responses must carry
    Content-Length (the gateway's all do).
    """

    def __init__(self, url: str) -> None:
        parts = urllib.parse.urlsplit(url)
        self._address = (parts.hostname, parts.port)
        self._host = parts.netloc.encode()
        self._socket: socket.socket | None = None
        self._buffer = b""

    def request(self, method: str, path: str, body: bytes | None = None) -> tuple[int, str]:
        """(status, Server-Timing header) of one request; the body is read whole."""
        head = [f"{method} {path} HTTP/1.1".encode(), b"Host: " + self._host]
        if body is not None:
            head += [b"Content-Type: application/json", b"Content-Length: %d" % len(body)]
        message = b"\r\n".join(head) + b"\r\n\r\n" + (body or b"")
        try:
            self._send(message)
            status_line, headers = self._read_head()
        except ConnectionError:
            # The server closes a connection left idle past its keep-alive timeout
            # (while another stack warms up): reconnect and send again, as
            # http.client does.
            self.close()
            self._send(message)
            status_line, headers = self._read_head()
        self._read_exactly(int(headers.get("content-length", "0")))
        return int(status_line.split()[1]), headers.get("server-timing", "")

    def _send(self, message: bytes) -> None:
        if self._socket is None:
            self._socket = socket.create_connection(self._address, timeout=60)
            self._socket.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._socket.sendall(message)

    def _read_head(self) -> tuple[str, dict[str, str]]:
        while b"\r\n\r\n" not in self._buffer:
            self._receive()
        head, self._buffer = self._buffer.split(b"\r\n\r\n", 1)
        status_line, *lines = head.decode("latin-1").split("\r\n")
        headers = {}
        for line in lines:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
        if "content-length" not in headers:
            raise RuntimeError(f"response without Content-Length: {status_line}")
        return status_line, headers

    def _read_exactly(self, size: int) -> bytes:
        while len(self._buffer) < size:
            self._receive()
        data, self._buffer = self._buffer[:size], self._buffer[size:]
        return data

    def _receive(self) -> None:
        chunk = self._socket.recv(65536)
        if not chunk:
            raise ConnectionError("the server closed the connection")
        self._buffer += chunk

    def close(self) -> None:
        if self._socket is not None:
            self._socket.close()
        self._socket, self._buffer = None, b""


class HttpxClient:
    """The same requests through one keep-alive ``httpx.Client``."""

    def __init__(self, url: str) -> None:
        self._client = httpx.Client(base_url=url, timeout=60)

    def request(self, method: str, path: str, body: bytes | None = None) -> tuple[int, str]:
        headers = {"Content-Type": "application/json"} if body is not None else {}
        reply = self._client.request(method, path, content=body, headers=headers)
        return reply.status_code, reply.headers.get("server-timing", "")

    def close(self) -> None:
        self._client.close()


CLIENTS = {"raw": RawClient, "http.client": LeanClient, "httpx": HttpxClient}


def environment_and_flags(words: list[str]) -> tuple[dict[str, str], list[str]]:
    """A configuration's words, ``VAR=VALUE ... --flag ...``: (the variables, the flags)."""
    first_flag = next((i for i, w in enumerate(words) if w.startswith("-")), len(words))
    return dict(w.split("=", 1) for w in words[:first_flag]), words[first_flag:]


class Stack:
    """One ``embedserve serve`` from one source tree, and what it measured."""

    def __init__(self, spec: str, serve_flags: list[str], client: str = "raw") -> None:
        words = spec.split()
        self.label = spec
        self.source = Path(words[0]).resolve()
        own_env, own_flags = environment_and_flags(words[1:])
        env = dict(os.environ, PYTHONPATH=str(self.source), PYTHONUNBUFFERED="1", **own_env)
        argv = [sys.executable, "-m", "embedserve.cli", "serve", "--port", "0",
                "--log-level", "warning", *serve_flags, *own_flags]
        self.process, match = popen_listening(argv, GATEWAY_LISTENING, env=env, cwd=str(self.source))
        self.url = match.group(1)
        self.client = CLIENTS[client](self.url)
        self.client_ms: list[float] = []
        self.sent_at: list[float] = []          # perf_counter seconds, per recorded request
        self.timings: list[dict[str, float]] = []
        self.gateway_cpu_s = 0.0
        self.replica_cpu_s = 0.0

    def cpu(self) -> tuple[float, float]:
        """CPU seconds so far: the gateway (the serve process), its replicas together."""
        return cpu_seconds(self.process.pid), sum(map(cpu_seconds, child_pids(self.process.pid)))

    def run_block(self, body: bytes, count: int, pause_s: float = 0.0) -> None:
        gateway_before, replicas_before = self.cpu()
        for _ in range(count):
            if pause_s:
                time.sleep(pause_s)
            self.query(body, record=True)
        gateway_after, replicas_after = self.cpu()
        self.gateway_cpu_s += gateway_after - gateway_before
        self.replica_cpu_s += replicas_after - replicas_before

    def wait_ready(self, timeout_s: float = 300.0) -> None:
        """Until the stack answers ``/ready`` and no child of it compiles tokenizer kernels:
        a tree serving for the first time compiles them in the background, which took the
        CPU from the measured requests and counted as its replicas' (a BASE tree read
        7.3 against 3.3 ms of replica CPU a query, 3.3 once compiled)."""
        deadline = time.monotonic() + timeout_s
        while self.client.request("GET", "/ready")[0] != 200 or compiling_tokenizer(self.process.pid):
            if time.monotonic() > deadline:
                raise TimeoutError(f"{self.url} never became ready (or its tokenizer never compiled)")
            time.sleep(0.1)

    def query(self, body: bytes, record: bool) -> None:
        started = time.perf_counter()
        status, server_timing = self.client.request("POST", "/v1/embeddings", body)
        elapsed_ms = (time.perf_counter() - started) * 1e3
        if status != 200:
            raise RuntimeError(f"{self.url}/v1/embeddings answered {status}")
        if record:
            self.client_ms.append(elapsed_ms)
            self.sent_at.append(started)
            self.timings.append(parse_server_timing(server_timing))

    def close(self) -> None:
        self.client.close()
        stop_popen(self.process, 60.0)


def idle_penalty(text: str, repeats: int = 200, idle_s: float = 0.01) -> tuple[float, float]:
    """(hot, after idle) p50 µs of the same small piece of Python work: JSON round trips
    of a request body and a tokenization of ``text``.

    A short query's overhead is code that runs once after the replica's compute has
    kept this process waiting; on a virtual machine whose idle vCPU the host hands to
    others, that code then runs from cold caches and TLBs. The ratio says how much
    slower the same work is then on this machine, apart from the stack.
    """
    from embedserve.defaults.build import ensure_default_model
    from embedserve.defaults.model_args import default_cache_dir
    from embedserve.tokenizer import load_tokenizer

    tokenizer = load_tokenizer(ensure_default_model(default_cache_dir()))
    body = json.dumps({"input": [text], "model": "m", "encoding_format": "float"})

    def work() -> None:
        for _ in range(20):
            json.loads(json.dumps(json.loads(body)))
        tokenizer.encode_batch([text])

    def p50_us(pause: float) -> float:
        samples = []
        for _ in range(repeats):
            if pause:
                time.sleep(pause)
            started = time.perf_counter()
            work()
            samples.append(time.perf_counter() - started)
        return float(np.median(samples)) * 1e6

    work()
    return p50_us(0.0), p50_us(idle_s)


def bursts(times_s: np.ndarray, gap_s: float = 1.0) -> int:
    """How many spells ``times_s`` (seconds, any order) fall into: times less than ``gap_s``
    apart belong to one."""
    if times_s.size == 0:
        return 0
    return 1 + int(np.count_nonzero(np.diff(np.sort(times_s)) >= gap_s))


def summarize(stack: Stack) -> list[tuple[str, float]]:
    client = np.array(stack.client_ms)
    inference = np.array([t.get("inference", np.nan) for t in stack.timings])
    total = np.array([t.get("total", np.nan) for t in stack.timings])
    rows = [("client p50", float(np.median(client))),
            ("client p99", float(np.percentile(client, 99))),
            ("inference p50", float(np.nanmedian(inference))),
            ("overhead p50 (client - inference)", float(np.nanmedian(client - inference))),
            ("outside p50 (client - total)", float(np.nanmedian(client - total))),
            ("gateway CPU per request", 1e3 * stack.gateway_cpu_s / len(client)),
            ("replica CPU per request", 1e3 * stack.replica_cpu_s / len(client))]
    # Where the tail comes from: the requests at or above the client's p99, their medians.
    slow = client >= np.percentile(client, 99)
    rows += [("inference p99", float(np.nanpercentile(inference, 99))),
             ("slowest 1 %: inference", float(np.nanmedian(inference[slow]))),
             ("slowest 1 %: gateway and hop (total - inference)", float(np.nanmedian((total - inference)[slow]))),
             ("slowest 1 %: outside (client - total)", float(np.nanmedian((client - total)[slow]))),
             ("slowest 1 %: requests", float(np.count_nonzero(slow))),
             ("slowest 1 %: bursts (< 1 s apart)", float(bursts(np.array(stack.sent_at)[slow])))]
    names = list(dict.fromkeys(name for t in stack.timings for name in t))
    for name in names:
        rows.append((f"  {name}", float(np.nanmedian([t.get(name, np.nan) for t in stack.timings]))))
    return rows


def add_stack_arguments(parser: argparse.ArgumentParser) -> None:
    """``--stack`` (repeatable) and the serve flags after ``--``, as the A/B benchmarks take them."""
    parser.add_argument("--stack", action="append", default=None,
                        help="a source tree to serve from, then VAR=VALUE and --flags for it "
                             "(repeat to compare; default: this checkout)")
    parser.add_argument("serve_flags", nargs=argparse.REMAINDER,
                        help="flags for embedserve serve, after --")


def stack_arguments(args: argparse.Namespace) -> tuple[list[str], list[str]]:
    """(the ``--stack`` specs, this checkout when none; the serve flags for every stack)."""
    return args.stack or [str(ROOT)], [f for f in args.serve_flags if f != "--"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench overhead",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--iterations", type=int, default=400, help="measured requests per stack")
    parser.add_argument("--warmup", type=int, default=50, help="unmeasured requests per stack first")
    parser.add_argument("--block", type=int, default=20, help="requests per stack per turn")
    parser.add_argument("--text", default=DEFAULT_TEXT, help="the query (default: one sentence)")
    parser.add_argument("--pause-ms", type=float, default=0.0,
                        help="asleep before each measured request, ms: sporadic queries, the stack's "
                             "threads idle between them (default: 0, back to back)")
    parser.add_argument("--client", choices=sorted(CLIENTS), default="raw",
                        help="the HTTP client (default: a bare socket, one write per request)")
    add_stack_arguments(parser)
    args = parser.parse_args(argv)
    specs, serve_flags = stack_arguments(args)
    body = json.dumps({"input": args.text}).encode()  # serialized once: not the stack's time
    load_before = os.getloadavg()
    stacks: list[Stack] = []
    try:
        for spec in specs:
            stacks.append(Stack(spec, serve_flags, args.client))
        for stack in stacks:
            stack.wait_ready()
            for _ in range(args.warmup):
                stack.query(body, record=False)
        done = 0
        while done < args.iterations:
            count = min(args.block, args.iterations - done)
            for stack in stacks:
                stack.run_block(body, count, args.pause_ms / 1e3)
            done += count
    finally:
        for stack in stacks:
            stack.close()
    load_after = os.getloadavg()
    hot_us, cold_us = idle_penalty(args.text)
    pause = f", {args.pause_ms:g} ms asleep before each" if args.pause_ms else ""
    print(f"overhead bench: {args.iterations} sequential requests per stack{pause}, {len(args.text)} chars, "
          f"serve {' '.join(serve_flags) or '(defaults)'}, client {args.client}; load average "
          f"{load_before[0]:.2f} before, {load_after[0]:.2f} after")
    print(f"idle penalty of this machine: the same Python work (JSON, a tokenization) p50 "
          f"{hot_us:.0f} µs back to back, {cold_us:.0f} µs after 10 ms asleep "
          f"({cold_us / hot_us:.1f}x)")
    summaries = [dict(summarize(s)) for s in stacks]
    labels = list(dict.fromkeys(label for summary in summaries for label in summary))
    for k, stack in enumerate(stacks):
        print(f"[{k}] {stack.label}")
    print(f"{'ms':<36}" + "".join(f"{f'[{k}]':>10}" for k in range(len(stacks))))
    for label in labels:
        cells = "".join(f"{summary.get(label, float('nan')):>10.3f}" for summary in summaries)
        print(f"{label:<36}{cells}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
