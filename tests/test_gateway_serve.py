"""``embedserve serve``: the whole stack from one command, as a real process tree.

Runs the default model (so that requests are still running when the
signal lands at the end), with two replicas on port 0.
Checks the banner, a request, that the gateway calls its replicas over Unix
domain sockets in a private directory removed at exit, that the replicas refuse
calls that do not come from this gateway (a fresh token per run, in a private
0600 file removed at exit), that Embed/Score go as frames on the socket beside each replica's (also refused
without the token), that requests in flight on a replica that is killed are
answered by the other, that a killed replica is restarted (on the same
socket) and put back, and that SIGTERM under load loses nothing
(tests/sigterm_load.py's checks) and stops the gateway and every replica with
status 0. One stack for all of it: the SIGTERM-under-load check for ``serve``
(tests/test_launch_shutdown.py has the lone gateway's) is this test's end.
``--replica-transport tcp`` serves over loopback TCP instead.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import stat
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
import httpx
import numpy as np
import pytest

from embedserve.entrypoint import GATEWAY_LISTENING
from embedserve.link.frame_client import FrameChannel, ReplicaCallError
from embedserve.link.frames import frame_socket_path
from embedserve.protos import inference_pb2, inference_pb2_grpc
from process_tree import alive, children
from sigterm_load import assert_nothing_lost, sigterm_under_load


def tcp_listening_ports(pid: int) -> set[int]:
    """The TCP ports process ``pid`` listens on (its sockets' inodes in /proc/net/tcp*)."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        with contextlib.suppress(OSError):
            target = os.readlink(fd)
            if target.startswith("socket:["):
                inodes.add(target[len("socket:["):-1])
    ports = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == "0A" and fields[9] in inodes:   # 0A: LISTEN
                ports.add(int(fields[1].rsplit(":", 1)[1], 16))
    return ports


def wait_healthy(url: str, count: int, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        replicas = httpx.get(url + "/info", timeout=10).json()["replicas"]
        if sum(r["healthy"] for r in replicas) == count:
            return
        time.sleep(0.1)
    raise TimeoutError(f"never saw {count} healthy replicas")


def test_serve_runs_restarts_and_stops_cleanly(default_model_dir):
    env = dict(os.environ, OMP_NUM_THREADS="1")
    process = subprocess.Popen(
        [sys.executable, "-m", "embedserve.cli", "serve", "--replicas", "2", "--port", "0",
         "--model", str(default_model_dir), "--served-model-name", "tiny", "tiny-alias",
         "--dtype", "float32"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    output: list[str] = []
    try:
        url = None
        assert process.stdout is not None
        for line in process.stdout:
            match = GATEWAY_LISTENING.search(line)
            if match:
                url = match.group(1)
                break
        assert url, "serve exited without printing where it listens"
        reader = threading.Thread(target=lambda: output.extend(process.stdout), daemon=True)
        reader.start()
        wait_healthy(url, 2)
        reply = httpx.post(url + "/v1/embeddings", json={"input": ["one command"]}, timeout=60).json()
        vector = np.array(reply["data"][0]["embedding"])
        assert reply["model"] == "tiny"
        models = httpx.get(url + "/v1/models", timeout=10).json()["data"]
        assert [m["id"] for m in models] == ["tiny", "tiny-alias"]
        aliased = httpx.post(url + "/v1/embeddings", json={"input": "x", "model": "tiny-alias"}, timeout=60)
        assert aliased.json()["model"] == "tiny-alias"
        unknown = httpx.post(url + "/v1/embeddings", json={"input": "x", "model": str(default_model_dir)}, timeout=60)
        assert unknown.status_code == 404 and unknown.json()["error"]["code"] == "model_not_found"
        assert vector.shape == (384,) and abs(np.linalg.norm(vector) - 1) < 1e-5

        replicas = children(process.pid)
        assert len(replicas) == 2
        for pid in (process.pid, replicas[0]):   # entrypoint.run_event_loop's loop
            assert "uvloop/loop." in open(f"/proc/{pid}/maps").read()
        # Their OpenMP threads stop spinning soon after a step (launch/commands.py).
        environ = open(f"/proc/{replicas[0]}/environ", "rb").read().split(b"\0")
        assert b"GOMP_SPINCOUNT=20000" in environ
        # Only this gateway may call the replicas: a client without the run's token is refused.
        argv = open(f"/proc/{replicas[0]}/cmdline").read().split("\0")
        token_file = Path(argv[argv.index("--replica-token-file") + 1])
        assert stat.S_IMODE(token_file.stat().st_mode) == 0o600
        assert stat.S_IMODE(token_file.parent.stat().st_mode) == 0o700
        listed = httpx.get(url + "/info", timeout=10).json()["replicas"]
        addresses = [r["address"] for r in listed]
        assert all(a.startswith("unix:/") for a in addresses), addresses
        assert [r["calls"] for r in listed] == ["frames", "frames"]
        sockets = [Path(a[len("unix:"):]) for a in addresses]
        assert all(s.is_socket() for s in sockets) and len(set(sockets)) == 2
        assert stat.S_IMODE(sockets[0].parent.parent.stat().st_mode) == 0o700
        # Called over the Unix socket's frames, a replica listens on TCP for gRPC (probes,
        # reflection) and its Prometheus endpoint (merged into the gateway's /metrics)
        # alone: no frame port nobody calls.
        assert len(tcp_listening_ports(replicas[0])) == 2
        address = addresses[0]
        with grpc.insecure_channel(address) as channel:
            with pytest.raises(grpc.RpcError) as refused:
                inference_pb2_grpc.InferenceStub(channel).Info(inference_pb2.InfoRequest(), timeout=30)
        assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
        # So is its frame socket.
        with pytest.raises(ReplicaCallError) as refused_frames:
            asyncio.run(FrameChannel.open(frame_socket_path(sockets[0]), None, timeout_s=30))
        assert refused_frames.value.code() == grpc.StatusCode.UNAUTHENTICATED
        # A replica killed with requests in flight: they are answered by the other one.
        texts = [f"request {k}: " + "words to embed " * 60 for k in range(8)]
        with ThreadPoolExecutor(len(texts)) as pool:
            answers = [pool.submit(httpx.post, url + "/v1/embeddings", json={"input": [t] * 4},
                                   timeout=120) for t in texts]
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline and not all(    # both replicas are busy with them
                    r["outstanding_tokens"] for r in httpx.get(url + "/info", timeout=10).json()["replicas"]):
                time.sleep(0.01)
            os.kill(replicas[0], signal.SIGKILL)
            for text, answer in zip(texts, answers):
                reply = answer.result()
                assert reply.status_code == 200, reply.text
                alone = httpx.post(url + "/v1/embeddings", json={"input": text}, timeout=60).json()
                np.testing.assert_allclose([d["embedding"] for d in reply.json()["data"]],
                                           [alone["data"][0]["embedding"]] * 4, atol=1e-5)
        # Some were in flight on the killed replica: the gateway retried them on the other.
        metrics = httpx.get(url + "/metrics", timeout=10).text
        assert sum(float(line.split()[-1]) for line in metrics.splitlines()
                   if line.startswith("embedserve_gateway_chunk_retries_total")) > 0
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and (replicas[0] in children(process.pid)
                                               or len(children(process.pid)) < 2):
            time.sleep(0.1)
        wait_healthy(url, 2)          # restarted on its port and back in rotation
        assert [r["calls"] for r in httpx.get(url + "/info", timeout=10).json()["replicas"]] \
            == ["frames", "frames"]
        assert httpx.post(url + "/embed", json={"inputs": "again"}, timeout=60).status_code == 200

        current = children(process.pid)
        tally = sigterm_under_load(process, url)
        assert process.wait(90) == 0
        assert_nothing_lost(tally)
        reader.join(30)
        # The restart above forks the gateway's process, which has gRPC threads; Python run
        # between that fork and exec crashed the child (SIGSEGV) in about one restart of four.
        assert not [line for line in output if "failed to restart" in line], "".join(output[-50:])
        assert not any(alive(pid) for pid in current)
        assert not token_file.parent.exists()
        assert not sockets[0].parent.parent.exists()
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


def test_serve_over_tcp_when_asked(tiny_bert_dir):
    from serve_harness import served

    with served("--model", str(tiny_bert_dir), "--replica-transport", "tcp") as url:
        address = httpx.get(url + "/info", timeout=10).json()["replicas"][0]["address"]
        assert address.startswith("127.0.0.1:")
        reply = httpx.post(url + "/v1/embeddings", json={"input": "over tcp"}, timeout=60)
        assert reply.status_code == 200
        assert abs(np.linalg.norm(reply.json()["data"][0]["embedding"]) - 1) < 1e-5
        # The replica's scheduler and engine metrics, merged into the gateway's, by replica.
        metrics = {line.split()[0]: float(line.split()[-1])
                   for line in httpx.get(url + "/metrics", timeout=10).text.splitlines()
                   if line and not line.startswith("#")}
        label = f'replica="{address}"'
        assert metrics[f'embedserve_gateway_replicas{{model="{tiny_bert_dir.name}"}}'] == 1
        steps = [v for k, v in metrics.items() if k.startswith("embedserve_engine_steps") and label in k]
        assert steps and steps[0] >= 1, sorted(metrics)
        batches = [v for k, v in metrics.items()
                   if k.startswith("embedserve_scheduler_batch_sequences_count") and label in k]
        assert batches and batches[0] >= 1, sorted(metrics)
