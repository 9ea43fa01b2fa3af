"""A replica listening on a Unix domain socket (``embedserve scheduler --unix-socket``)
and on TCP at once: a gateway reaches it through either (``--upstream unix:PATH``, the
way ``embedserve serve`` wires its local replicas, or ``host:port``, the way a remote
gateway does) and gets the same answer. Its Embed/Score calls go as frames
(``--replica-calls frames``, the default: at ``unix:PATH`` on the socket beside it, at
``host:port`` on the TCP frame port its Info names) or over gRPC (``--replica-calls
grpc``). Real scheduler process, in-process gateways."""

from __future__ import annotations

import tempfile
from pathlib import Path

import httpx
import numpy as np
import pytest

from embedserve.gateway.discovery import source_for
from gateway_harness import GatewayServer, SchedulerProcess, gateway_settings


def test_unix_upstreams_are_taken_as_given_and_tcp_ones_still_parsed():
    assert source_for(["unix:/run/a.sock,unix:/run/b.sock"]).addresses == ("unix:/run/a.sock",
                                                                            "unix:/run/b.sock")
    assert source_for(["unix:/run/a.sock", "10.0.0.2:5001"]).addresses == ("unix:/run/a.sock",
                                                                           "10.0.0.2:5001")
    with pytest.raises(ValueError, match="expected host:port"):
        source_for(["unix:"])


def test_one_replica_answers_over_frames_its_grpc_socket_and_tcp_alike(tiny_bert_dir):
    with tempfile.TemporaryDirectory(prefix="es-") as directory:   # short: sun_path is 108 bytes
        socket_path = Path(directory) / "replica.sock"
        # A TCP frame port too: a replica given --unix-socket opens one only when asked.
        replica = SchedulerProcess(tiny_bert_dir, "--unix-socket", str(socket_path), "--frame-port", "0",
                                   threads=1)
        try:
            assert socket_path.is_socket()
            answers = {}
            for name, upstream, calls in (("frames", f"unix:{socket_path}", "frames"),
                                          ("unix", f"unix:{socket_path}", "grpc"),
                                          ("tcp frames", replica.address, "frames"),
                                          ("tcp", replica.address, "grpc")):
                server = GatewayServer(gateway_settings(tiny_bert_dir, [upstream], replica_calls=calls))
                try:
                    server.wait_ready(healthy=1)
                    info = httpx.get(server.url + "/info", timeout=10).json()["replicas"]
                    assert [r["address"] for r in info] == [upstream]
                    assert [r["calls"] for r in info] == [calls]
                    reply = httpx.post(server.url + "/v1/embeddings", timeout=60,
                                       json={"input": ["one sentence", "and another"]})
                    assert reply.status_code == 200, reply.text
                    answers[name] = np.array([d["embedding"] for d in reply.json()["data"]])
                    bad = httpx.post(server.url + "/v1/embeddings", timeout=60,
                                     json={"input": "x", "dimensions": 33})
                    answers[name + " error"] = (bad.status_code, bad.json()["error"]["message"])
                finally:
                    server.stop()
            assert answers["frames"].shape == (2, 32)
            for name in ("unix", "tcp frames"):
                np.testing.assert_array_equal(answers[name], answers["tcp"])
                assert answers[name + " error"] == answers["tcp error"]
            assert answers["frames error"][0] == 400
        finally:
            replica.stop()
