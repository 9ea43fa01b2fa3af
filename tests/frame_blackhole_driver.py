"""A replica's TCP frame port dropped on the way while its gRPC port stays reachable.

Run inside a network namespace of its own (``unshare -rn``, where policy routing may
be changed without privileges), by ``test_gateway_frames_tcp.py``: a replica with a
fixed frame port, an in-process gateway in front of it, and ``ip rule``s that
blackhole that port's packets in both directions, as an expired NAT entry or a
discarding firewall would: no reset, no error, nothing arrives. Prints what it saw
as one JSON object; the test judges it.

    python frame_blackhole_driver.py MODEL_DIR
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import numpy as np

from gateway_harness import GatewayServer, SchedulerProcess, free_port, gateway_settings, replica_view

TEXTS = ["one sentence", "and another one"]
BLACKHOLE_PREFERENCES = ("10", "11")


def ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True)


def route_loopback_behind_rules() -> None:
    """Loopback traffic is routed by the local table at preference 0, ahead of every
    other rule: moved behind the blackhole rules' preferences."""
    ip("link", "set", "lo", "up")
    ip("rule", "del", "pref", "0", "table", "local")
    ip("rule", "add", "pref", "100", "table", "local")


def blackhole(port: int) -> None:
    for preference, side in zip(BLACKHOLE_PREFERENCES, ("dport", "sport")):
        ip("rule", "add", "pref", preference, side, str(port), "blackhole")


def restore() -> None:
    for preference in BLACKHOLE_PREFERENCES:
        ip("rule", "del", "pref", preference)


def seconds_until(condition: Callable[[], bool], timeout: float) -> float | None:
    """How long ``condition`` took to hold; None if it did not within ``timeout``."""
    start = time.monotonic()
    while not condition():
        if time.monotonic() - start > timeout:
            return None
        time.sleep(0.05)
    return round(time.monotonic() - start, 2)


def main(model_dir: Path) -> dict:
    route_loopback_behind_rules()
    frame_port = free_port()
    replica = SchedulerProcess(model_dir, "--frame-port", str(frame_port), threads=1)
    server = GatewayServer(gateway_settings(model_dir, [replica.address], replica_ping_s=1.0,
                                            request_timeout_s=30.0))
    seen: dict = {}
    try:
        server.wait_ready(healthy=1)

        def embed() -> tuple[int, np.ndarray | None, float]:
            start = time.monotonic()
            reply = httpx.post(server.url + "/v1/embeddings", json={"input": TEXTS}, timeout=60)
            took = round(time.monotonic() - start, 2)
            if reply.status_code != 200:
                return reply.status_code, None, took
            return 200, np.array([d["embedding"] for d in reply.json()["data"]]), took

        seen["calls_before"] = replica_view(server)["calls"]
        status, before, _ = embed()
        seen["status_before"] = status

        # Idle: nothing is sent, so only the keepalive probes can find the loss.
        blackhole(frame_port)
        seen["idle_found_after_s"] = seconds_until(lambda: replica_view(server)["calls"] == "grpc", timeout=20)
        seen["healthy_while_dropped"] = replica_view(server)["healthy"]
        status, vectors, _ = embed()
        seen["status_while_dropped"] = status
        seen["same_while_dropped"] = vectors is not None and np.allclose(vectors, before, atol=1e-6)

        restore()
        seen["frames_again_after_s"] = seconds_until(lambda: replica_view(server)["calls"] == "frames", timeout=60)

        # In flight: the call is sent into the blackhole and waits for an answer.
        blackhole(frame_port)
        status, vectors, took = embed()
        seen["status_in_flight"] = status
        seen["in_flight_s"] = took
        seen["same_in_flight"] = vectors is not None and np.allclose(vectors, before, atol=1e-6)
        seen["healthy_after"] = replica_view(server)["healthy"]
    finally:
        server.stop()
        replica.stop()
    return seen


if __name__ == "__main__":
    print(json.dumps(main(Path(sys.argv[1]))))
