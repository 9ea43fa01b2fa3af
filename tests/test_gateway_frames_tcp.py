"""A gateway that reaches a replica at ``host:port`` calls it as frames on the TCP
frame port its Info names, and keeps doing so: after the replica restarts at the
same address (a new process, a new frame port), after the frame connection is lost
while the replica serves on, and not at all where that port cannot be reached (the
replica's gRPC port published somewhere its frame port is not): there its calls
stay on gRPC. Real replicas (a scheduler process, or one in this process whose
connections the test can cut), in-process gateways, answers compared across
transports and against a gateway that reaches the same replica directly.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import signal
import socket
import threading
import time
from collections.abc import Iterator

import httpx
import numpy as np
import pytest
from scheduler_harness import ThreadedScheduler, wait_until

from embedserve.scheduler.settings import SchedulerSettings
from gateway_harness import GatewayServer, SchedulerProcess, gateway_settings

TEXTS = ["one sentence", "and another one"]


@contextlib.contextmanager
def gateway(model_dir, upstream: str, **overrides) -> Iterator[GatewayServer]:
    server = GatewayServer(gateway_settings(model_dir, [upstream], **overrides))
    try:
        server.wait_ready(healthy=1)
        yield server
    finally:
        server.stop()


def replica_view(server: GatewayServer) -> dict:
    return httpx.get(server.url + "/info", timeout=10).json()["replicas"][0]


def embed(server: GatewayServer) -> np.ndarray:
    reply = httpx.post(server.url + "/v1/embeddings", json={"input": TEXTS}, timeout=60)
    assert reply.status_code == 200, reply.text
    return np.array([d["embedding"] for d in reply.json()["data"]])


class Forwarder:
    """A TCP port on ``host`` that pipes every connection to ``target``: the replica's
    gRPC port published at another address, where its frame port is not."""

    def __init__(self, host: str, target: tuple[str, int]) -> None:
        self._target = target
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._thread.start()
        self._server = asyncio.run_coroutine_threadsafe(
            asyncio.start_server(self._pipe, host, 0), self._loop).result(10)
        self.port = self._server.sockets[0].getsockname()[1]

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        upstream_reader, upstream_writer = await asyncio.open_connection(*self._target)

        async def copy(source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
            try:
                while data := await source.read(65536):
                    sink.write(data)
                    await sink.drain()
            finally:
                sink.close()
        await asyncio.gather(copy(reader, upstream_writer), copy(upstream_reader, writer),
                             return_exceptions=True)

    def close(self) -> None:
        async def shut() -> None:
            self._server.close()
            for task in asyncio.all_tasks():
                if task is not asyncio.current_task():
                    task.cancel()
        asyncio.run_coroutine_threadsafe(shut(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.mark.parametrize("frame_port", ["any", "fixed"])
def test_a_replica_restarted_at_its_address_is_called_over_frames_again(tiny_bert_dir, frame_port):
    # "fixed" as the deploys run it: the new process answers on the old frame port with
    # a new instance id, which the gateway must take from its new Info.
    extra = ("--frame-port", str(free_port())) if frame_port == "fixed" else ()
    replica = SchedulerProcess(tiny_bert_dir, *extra, threads=1)
    try:
        with gateway(tiny_bert_dir, replica.address, request_timeout_s=1.0) as server:
            assert replica_view(server)["calls"] == "frames"
            before = embed(server)
            # A call in flight over frames when the process dies: a clean error once its
            # retry finds no replica before the deadline, not a hang.
            replica.process.send_signal(signal.SIGSTOP)
            with concurrent.futures.ThreadPoolExecutor(1) as pool:
                in_flight = pool.submit(httpx.post, server.url + "/v1/embeddings",
                                        json={"input": TEXTS}, timeout=60)
                time.sleep(0.3)
                replica.kill()
                failed = in_flight.result()
            assert failed.status_code in (503, 504), failed.text
            wait_until(lambda: not replica_view(server)["healthy"], what="the replica out of rotation")
            replica.start()   # the same gRPC port; a new process
            wait_until(lambda: replica_view(server)["healthy"] and replica_view(server)["calls"] == "frames",
                       timeout=60, what="the restarted replica called over frames")
            np.testing.assert_array_equal(embed(server), before)
    finally:
        replica.stop()


def test_a_lost_frame_connection_is_reopened_while_the_replica_serves(bert_engine, tiny_bert_dir):
    settings = SchedulerSettings(model_dir=tiny_bert_dir, max_batch_tokens=512, dtype="float32")
    with ThreadedScheduler(settings, bert_engine) as replica, \
            gateway(tiny_bert_dir, f"127.0.0.1:{replica.port}") as server:
        assert replica_view(server)["calls"] == "frames"
        before = embed(server)
        first = set(replica.server.frame_server.connections)
        assert len(first) == 1

        async def cut() -> None:
            for connection in list(replica.server.frame_server.connections):
                connection.close()
        replica.call(cut())
        # gRPC carries its calls meanwhile; the gateway opens a new connection.
        wait_until(lambda: replica.server.frame_server.connections - first != set()
                   and replica_view(server)["calls"] == "frames", what="a new frame connection")
        assert replica_view(server)["healthy"]
        np.testing.assert_array_equal(embed(server), before)


def test_a_frame_port_the_gateway_cannot_reach_leaves_its_calls_on_grpc(tiny_bert_dir):
    replica = SchedulerProcess(tiny_bert_dir, threads=1)   # bound to 127.0.0.1 only
    published = Forwarder("127.0.0.2", ("127.0.0.1", replica.port))
    try:
        with gateway(tiny_bert_dir, f"127.0.0.2:{published.port}") as server:
            view = replica_view(server)
            assert view["healthy"] and view["calls"] == "grpc"
            through_grpc = embed(server)
        with gateway(tiny_bert_dir, replica.address) as direct:
            assert replica_view(direct)["calls"] == "frames"
            np.testing.assert_array_equal(embed(direct), through_grpc)
    finally:
        published.close()
        replica.stop()
