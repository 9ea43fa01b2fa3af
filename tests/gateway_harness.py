"""Test harness for the gateway tests: real replicas and a real gateway on loopback.

``SchedulerProcess`` runs ``embedserve scheduler`` as a child process on port
0 (the port is read from the line it prints once SERVING); it can be killed
and restarted on the same port. ``GatewayServer`` runs ``create_app`` under
uvicorn on a background thread bound to 127.0.0.1:0. Nothing is mocked.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import uvicorn
from prometheus_client.parser import text_string_to_metric_families

from embedserve.entrypoint import SCHEDULER_LISTENING
from embedserve.gateway.app import create_app
from embedserve.gateway.cli import listening_socket
from embedserve.gateway.settings import GatewaySettings
from embedserve.launch.commands import scheduler_command
from embedserve.launch.processes import stop_popen

START_TIMEOUT_S = 240.0


class SchedulerProcess:
    """``embedserve scheduler`` as a child process."""

    def __init__(self, model_dir: Path, *extra: str, threads: int | None = None) -> None:
        self.model_dir = model_dir
        # float32 unless the test names a dtype: tests compare against float32
        # references, and the replica's own default (auto) may pick bfloat16.
        self.extra = extra if "--dtype" in extra else ("--dtype", "float32", *extra)
        self.env = dict(os.environ)
        if threads is not None:
            self.env["OMP_NUM_THREADS"] = str(threads)
        self.port = 0
        self.metrics_port = 0
        self.process: subprocess.Popen | None = None
        self.start()

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def unix_address(self) -> str:
        """``unix:PATH`` of a replica started with ``--unix-socket PATH``."""
        return f"unix:{self.extra[self.extra.index('--unix-socket') + 1]}"

    def start(self) -> None:
        command = scheduler_command(self.model_dir, port=self.port, metrics_port=self.metrics_port,
                                    extra=self.extra)
        self.process = subprocess.Popen(command, stdout=subprocess.PIPE, text=True, env=self.env)
        try:
            self._wait_serving()
        except BaseException:
            # Never leave a half-started replica behind: nobody holds it to stop it.
            self.process.kill()
            self.process.wait()
            raise

    def _wait_serving(self) -> None:
        assert self.process is not None and self.process.stdout is not None
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            line = self.process.stdout.readline()
            if not line:
                raise RuntimeError(f"scheduler exited with {self.process.wait()} before serving")
            match = SCHEDULER_LISTENING.search(line)
            if match:
                self.port = int(match.group(1).rsplit(":", 1)[1])
                self.metrics_port = int(match.group(2).rsplit(":", 1)[1])
                # Drain stdout in the background so the child never blocks on it.
                threading.Thread(target=self.process.stdout.read, daemon=True).start()
                return
        raise RuntimeError("scheduler did not start in time")

    def metric(self, name: str, **labels: str) -> float:
        """One sample from the replica's Prometheus endpoint (0 when absent)."""
        text = httpx.get(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=10).text
        return metric_value(text, name, **labels)

    def kill(self) -> None:
        assert self.process is not None
        self.process.send_signal(signal.SIGKILL)
        self.process.wait()

    def stop(self) -> None:
        if self.process is not None:
            stop_popen(self.process, grace_s=30)


class GatewayServer:
    """The gateway app under uvicorn on a background thread, bound to port 0."""

    def __init__(self, settings: GatewaySettings, tracer=None) -> None:
        self.settings = settings
        self.app = create_app(settings, tracer=tracer)   # tracer: embedserve.otel.Tracer
        sock = listening_socket("127.0.0.1", 0)
        self.url = f"http://127.0.0.1:{sock.getsockname()[1]}"
        self.server = uvicorn.Server(uvicorn.Config(self.app, log_level="warning"))
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [sock]}, daemon=True)
        self.thread.start()
        while not self.server.started:
            if not self.thread.is_alive():
                raise RuntimeError("the gateway failed to start")
            time.sleep(0.02)

    def client(self, **kwargs) -> httpx.Client:
        return httpx.Client(base_url=self.url, timeout=kwargs.pop("timeout", 120.0), **kwargs)

    def wait_ready(self, healthy: int = 1, timeout: float = 60.0) -> None:
        """Wait until ``healthy`` replicas are in rotation (read from /info)."""
        deadline = time.monotonic() + timeout
        key = self.settings.api_key
        with self.client(headers={"authorization": f"Bearer {key}"} if key else {}) as client:
            while time.monotonic() < deadline:
                replicas = client.get("/info").json()["replicas"]
                if sum(r["healthy"] for r in replicas) >= healthy:
                    return
                time.sleep(0.05)
        raise TimeoutError(f"fewer than {healthy} replicas became healthy")

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(30)


def free_port() -> int:
    """A TCP port on 127.0.0.1 free now (for a process that must be told its port)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def replica_view(server: GatewayServer) -> dict:
    """The gateway's ``/info`` entry of its first replica (health, how it is called)."""
    return httpx.get(server.url + "/info", timeout=10).json()["replicas"][0]


def metric_value(text: str, name: str, **labels: str) -> float:
    """Sum of the samples of ``name`` whose labels include ``labels``."""
    total = 0.0
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                total += sample.value
    return total


def gateway_settings(model_dir: Path, upstreams: list[str], **overrides) -> GatewaySettings:
    return GatewaySettings(model_dir=model_dir, upstreams=tuple(upstreams), port=0, **overrides)


@contextlib.contextmanager
def gateway_in_front_of(replica: SchedulerProcess, **overrides) -> Iterator[GatewayServer]:
    """An in-process gateway for a running ``replica`` (its model), ready; stopped afterwards.
    ``overrides``: GatewaySettings fields."""
    server = GatewayServer(gateway_settings(replica.model_dir, [replica.address], **overrides))
    try:
        server.wait_ready(healthy=1)
        yield server
    finally:
        server.stop()


@contextlib.contextmanager
def one_replica_stack(model_dir: Path, **overrides) -> Iterator[GatewayServer]:
    """A real scheduler process (one thread) serving ``model_dir`` behind an in-process
    gateway, ready; both stopped afterwards. ``overrides``: GatewaySettings fields."""
    replica = SchedulerProcess(model_dir, threads=1)
    try:
        with gateway_in_front_of(replica, **overrides) as server:
            yield server
    finally:
        replica.stop()
