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
import json
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest

from embedserve.scheduler.settings import SchedulerSettings
from gateway_harness import GatewayServer, SchedulerProcess, free_port, gateway_settings, metric_value, replica_view
from scheduler_harness import ThreadedScheduler, wait_until

TEXTS = ["one sentence", "and another one"]


@contextlib.contextmanager
def gateway(model_dir, upstream: str, **overrides) -> Iterator[GatewayServer]:
    server = GatewayServer(gateway_settings(model_dir, [upstream], **overrides))
    try:
        server.wait_ready(healthy=1)
        yield server
    finally:
        server.stop()


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


def test_a_call_in_flight_when_its_frame_connection_is_lost_is_answered_over_grpc(
        bert_engine, tiny_bert_dir):
    # The replica serves on; only the connection went. A lone replica must not be
    # taken out of rotation for it (that answered 503): the call is retried on it
    # over gRPC.
    settings = SchedulerSettings(model_dir=tiny_bert_dir, max_batch_tokens=512, dtype="float32")
    with ThreadedScheduler(settings, bert_engine) as replica, \
            gateway(tiny_bert_dir, f"127.0.0.1:{replica.port}") as server:
        assert replica_view(server)["calls"] == "frames"
        before = embed(server)
        arrived = threading.Event()

        async def reset_with_the_call_unread() -> None:
            # The replica's loop is held while the call's frame arrives; closing a
            # socket with unread bytes sends a reset.
            connection = next(iter(replica.server.frame_server.connections))
            arrived.wait(30)
            time.sleep(0.3)
            connection.close()

        def gateway_metric(name: str) -> float:
            return metric_value(httpx.get(server.url + "/metrics", timeout=10).text, name)

        retried_before = gateway_metric("embedserve_gateway_chunk_retries_total")
        held = replica.submit(reset_with_the_call_unread())
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            answer = pool.submit(httpx.post, server.url + "/v1/embeddings",
                                 json={"input": TEXTS}, timeout=60)
            # Admitted (its tokens counted in flight); its frame is written right after.
            wait_until(lambda: gateway_metric("embedserve_gateway_inflight_tokens") > 0,
                       what="the request admitted")
            arrived.set()
            reply = answer.result()
        held.result(30)
        assert reply.status_code == 200, reply.text
        np.testing.assert_array_equal(np.array([d["embedding"] for d in reply.json()["data"]]), before)
        # It went over frames first, and failed there.
        assert gateway_metric("embedserve_gateway_chunk_retries_total") == retried_before + 1
        assert replica_view(server)["healthy"]


@pytest.fixture
def own_network_namespace() -> None:
    """Skip unless this machine lets a user make a network namespace and route in it."""
    if shutil.which("unshare") is None or shutil.which("ip") is None:
        pytest.skip("needs unshare and ip (util-linux, iproute2)")
    probe = subprocess.run(["unshare", "-rn", "ip", "rule", "add", "pref", "10", "dport", "9", "blackhole"],
                           capture_output=True, text=True)
    if probe.returncode != 0:
        pytest.skip(f"no user network namespaces with policy routing here: {probe.stderr.strip()}")


def test_a_frame_connection_dropped_on_the_way_is_found_and_its_calls_go_over_grpc(
        tiny_bert_dir, own_network_namespace):
    # The replica's frame port blackholed, its gRPC port not: without keepalive probes
    # the frame connection looks open forever and every call over it waits for its
    # deadline (30 s here).
    driver = Path(__file__).with_name("frame_blackhole_driver.py")
    run = subprocess.run(["unshare", "-rn", sys.executable, str(driver), str(tiny_bert_dir)],
                         capture_output=True, text=True, timeout=300, cwd=driver.parent)
    assert run.returncode == 0, run.stderr[-4000:]
    seen = json.loads(run.stdout.strip().splitlines()[-1])
    assert seen["calls_before"] == "frames" and seen["status_before"] == 200, seen
    # Idle, the probes find it (1 s period: about 2 s), and the replica stays in rotation.
    assert seen["idle_found_after_s"] is not None, seen
    assert seen["healthy_while_dropped"] is True, seen
    assert seen["status_while_dropped"] == 200 and seen["same_while_dropped"], seen
    assert seen["frames_again_after_s"] is not None, seen
    # In flight: the unacknowledged call ends the connection, and is answered over gRPC.
    assert seen["status_in_flight"] == 200 and seen["same_in_flight"], seen
    assert seen["in_flight_s"] < 15, seen
    assert seen["healthy_after"] is True, seen


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
