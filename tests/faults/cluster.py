"""The cluster the fault suite breaks: one gateway and N replicas as processes.

Each process is a real ``embedserve gateway`` / ``embedserve scheduler``
started from the command lines in ``embedserve.launch.commands`` (the same ones
``embedserve cluster`` runs), either on loopback ports or, in namespace mode,
each on its own "host" (``tests.faults.netns``): the gateway then finds the
replicas through DNS (``--upstream dns:replicas:PORT``) and a replica's link
can be cut. Unlike ``embedserve cluster``, nothing here restarts a process by
itself: the suite kills, stops, restarts and watches each one on purpose.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from embedserve.entrypoint import GATEWAY_LISTENING, SCHEDULER_LISTENING
from embedserve.launch.commands import gateway_command, scheduler_command
from embedserve.launch.processes import free_port, stop_popen
from tests.faults.netns import REPLICAS_NAME, StarNetwork

_NS_GRPC_PORT, _NS_METRICS_PORT, _NS_HTTP_PORT = 50051, 9100, 8000


def _get(kind: str, url: str) -> int | str | None:
    try:
        with urllib.request.urlopen(url, timeout=3) as response:  # noqa: S310 (test hosts only)
            body = response.read().decode()
            return response.status if kind == "http" else body
    except urllib.error.HTTPError as exc:
        return exc.code if kind == "http" else None
    except (OSError, ValueError):
        return None


_GET_SCRIPT = ("import sys, urllib.request as u\n"
               "try:\n r = u.urlopen(sys.argv[2], timeout=3); b = r.read().decode()\n"
               " print(r.status if sys.argv[1] == 'http' else b)\n"
               "except Exception as e: print('ERR', e)\n")


@dataclass
class Process:
    """One child process with its log file; ``ns`` is its namespace, if any."""

    name: str
    argv: list[str]
    listening: re.Pattern[str]    # the line it prints once it listens
    log_path: Path
    env: dict[str, str]
    ns: str | None = None
    popen: subprocess.Popen[bytes] | None = None
    starts: int = 0

    def start(self) -> None:
        self.starts += 1
        with open(self.log_path, "ab") as log:
            log.write(f"--- start {self.starts}: {' '.join(self.argv)}\n".encode())
            log.flush()
            self.popen = subprocess.Popen(self.argv, stdout=log, stderr=subprocess.STDOUT,
                                          env=self.env, start_new_session=True)

    def running(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    def signal(self, sig: int) -> None:
        assert self.popen is not None
        self.popen.send_signal(sig)

    def wait_exit(self, timeout_s: float) -> int | None:
        """Exit status, or None if still running after ``timeout_s``."""
        assert self.popen is not None
        try:
            return self.popen.wait(timeout_s)
        except subprocess.TimeoutExpired:
            return None

    def wait_listening(self, timeout_s: float) -> str:
        """Wait for this start's ``listening on ...`` line; return the address it names."""
        deadline = time.monotonic() + timeout_s
        marker = f"--- start {self.starts}:"
        while time.monotonic() < deadline:
            text = self.log_path.read_text(errors="replace")
            current = text[text.rfind(marker):]
            match = self.listening.search(current)
            if match:
                return match.group(1)
            if not self.running():
                raise RuntimeError(f"{self.name} exited ({self.popen.returncode if self.popen else None})"
                                   f" before listening; log:\n{current[-3000:]}")
            time.sleep(0.05)
        raise RuntimeError(f"{self.name} did not listen within {timeout_s:.0f} s; see {self.log_path}")

    def stop(self, grace_s: float = 20.0) -> None:
        if self.popen is not None:
            stop_popen(self.popen, grace_s)


@dataclass
class FaultCluster:
    """A gateway and replicas; ``network`` set means namespace mode."""

    model_dir: Path
    log_dir: Path
    replicas: int = 2
    network: StarNetwork | None = None
    gateway_flags: tuple[str, ...] = ()
    replica_flags: tuple[str, ...] = ()
    # Namespace mode: find replicas by name (--upstream dns:replicas:PORT,
    # the name resolving to every replica host) instead of a static list.
    dns_discovery: bool = False
    replica_procs: list[Process] = field(default_factory=list)
    metrics_urls: list[str] = field(default_factory=list)
    gateway: Process | None = None
    gateway_url: str = ""

    def _env(self) -> dict[str, str]:
        env = dict(os.environ)
        # Two replicas, a gateway and the load share the cores: one thread each.
        env.update(OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", NUMBA_NUM_THREADS="1",
                   HF_HUB_OFFLINE="1", PYTHONUNBUFFERED="1")
        return env

    def start(self, timeout_s: float = 240.0) -> FaultCluster:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        env = self._env()
        addresses = []
        for i in range(self.replicas):
            if self.network is not None:
                host, port, metrics = "0.0.0.0", _NS_GRPC_PORT, _NS_METRICS_PORT
                reach = self.network.addresses[f"replica{i}"]
            else:
                host, port, metrics, reach = "127.0.0.1", free_port(), free_port(), "127.0.0.1"
            argv = scheduler_command(self.model_dir, host=host, port=port, metrics_port=metrics,
                                     extra=self.replica_flags)
            ns = self.network.replica_ns(i) if self.network else None
            self.replica_procs.append(Process(f"replica{i}", self._wrap(ns, argv), SCHEDULER_LISTENING,
                                              self.log_dir / f"replica{i}.log", env, ns))
            self.metrics_urls.append(f"http://{reach}:{metrics}/metrics")
            addresses.append(f"{reach}:{port}")
        if self.network is not None:
            upstream = f"dns:{REPLICAS_NAME}:{_NS_GRPC_PORT}" if self.dns_discovery else ",".join(addresses)
            host, port = "0.0.0.0", _NS_HTTP_PORT
            self.gateway_url = f"http://{self.network.addresses['gateway']}:{port}"
        else:
            upstream, host, port = ",".join(addresses), "127.0.0.1", free_port()
            self.gateway_url = f"http://127.0.0.1:{port}"
        argv = gateway_command(self.model_dir, upstream, host=host, port=port, extra=self.gateway_flags)
        ns = self.network.gateway_ns if self.network else None
        self.gateway = Process("gateway", self._wrap(ns, argv), GATEWAY_LISTENING,
                               self.log_dir / "gateway.log", env, ns)
        try:
            for proc in self.replica_procs:
                proc.start()
            self.gateway.start()
            for proc in [*self.replica_procs, self.gateway]:
                proc.wait_listening(timeout_s)
            self.wait_ready(timeout_s)
        except BaseException:
            self.stop()
            raise
        return self

    def _wrap(self, ns: str | None, argv: list[str]) -> list[str]:
        return self.network.wrap(ns, argv) if self.network is not None and ns else argv

    def wait_ready(self, timeout_s: float) -> None:
        """Until the gateway's /ready says a replica serves."""
        deadline = time.monotonic() + timeout_s
        while self.run_in(None, "http", f"{self.gateway_url}/ready") != 200:
            if time.monotonic() > deadline:
                raise RuntimeError(f"gateway not ready within {timeout_s:.0f} s")
            time.sleep(0.1)

    def run_in(self, ns: str | None, kind: str, url: str) -> int | str | None:
        """GET ``url`` from namespace ``ns`` (None: here): the status ("http") or body ("body").

        None when nothing answered. Another namespace needs a child process
        (``ip netns exec``); ``-S`` keeps its start cheap, it needs only urllib.
        """
        if ns is None or self.network is None:
            return _get(kind, url)
        argv = self.network.wrap(ns, [sys.executable, "-S", "-c", _GET_SCRIPT, kind, url])
        out = subprocess.run(argv, capture_output=True, text=True, timeout=15).stdout.strip()
        if not out or out.startswith("ERR"):
            return None
        return int(out) if kind == "http" else out

    def replica_calls_ok(self, index: int) -> float:
        """Embed calls replica ``index`` answered OK since it last started (its own metrics)."""
        body = self.run_in(self.replica_procs[index].ns, "body", self.metrics_urls[index])
        if not isinstance(body, str):
            return 0.0
        return sum(sample.value for family in text_string_to_metric_families(body)
                   for sample in family.samples
                   if sample.name == "embedserve_scheduler_calls_total" and sample.labels.get("code") == "OK")

    def stop(self) -> None:
        if self.gateway is not None:
            self.gateway.stop()
        for proc in self.replica_procs:
            proc.stop()
