"""The gateway's error statuses against real replicas: 401, 413, 429, 500, 503, 504.

A tiny random BERT (the ``tiny_bert_dir`` fixture, with the XLM-R tokenizer)
serves in a real scheduler process; it is paused with SIGSTOP to hold
requests in flight, which makes the overload and timeout cases deterministic.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import threading
import time

import httpx
import openai
import pytest

from gateway_harness import GatewayServer, SchedulerProcess, gateway_settings, metric_value


@pytest.fixture(scope="module")
def tiny_replica(tiny_bert_dir):
    replica = SchedulerProcess(tiny_bert_dir, threads=1)
    yield replica
    os.kill(replica.process.pid, signal.SIGCONT)
    replica.stop()


KEY = {"authorization": "Bearer sekret"}


@pytest.fixture(scope="module")
def gateway(tiny_bert_dir, tiny_replica):
    # One gateway with every limit small, so each error is cheap to provoke.
    server = GatewayServer(gateway_settings(tiny_bert_dir, [tiny_replica.address], api_key="sekret",
                                            max_body_bytes=4000, max_inflight_tokens=64,
                                            request_timeout_s=3.0,
                                            # No pings: a paused replica must look stuck,
                                            # not hung (hang detection: test_gateway_e2e).
                                            replica_ping_s=0))
    server.wait_ready()
    yield server
    server.stop()


def test_api_key(gateway, tiny_bert_dir):
    with gateway.client() as http:
        missing = http.post("/v1/embeddings", json={"input": "x"})
        wrong = http.post("/v1/embeddings", json={"input": "x"}, headers={"authorization": "Bearer nope"})
        right = http.post("/v1/embeddings", json={"input": "x"}, headers={"authorization": "Bearer sekret"})
        assert http.get("/health").status_code == 200      # probes stay open
        assert http.get("/ready").status_code == 200
        assert http.get("/docs").status_code == 200        # docs and their assets too
        assert http.get("/static-offline-docs/swagger-ui.css").status_code == 200
    for response in (missing, wrong):
        assert response.status_code == 401
        assert response.json()["error"]["code"] == "invalid_api_key"
        assert response.headers["x-request-id"]
    assert right.status_code == 200
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=gateway.url + "/v1", api_key="nope", max_retries=0).embeddings.create(
            input="x", model=tiny_bert_dir.name)
    ok = openai.OpenAI(base_url=gateway.url + "/v1", api_key="sekret", max_retries=0).embeddings.create(
        input="x", model=tiny_bert_dir.name)
    assert len(ok.data[0].embedding) == 32


def test_oversized_body_is_413(gateway):
    with gateway.client(headers=KEY) as http:
        declared = http.post("/embed", json={"inputs": "x" * 5000})
        chunked = http.post("/embed", content=iter([b'{"inputs": "', b"x" * 5000, b'"}']),
                            headers={"content-type": "application/json"})
    for response in (declared, chunked):
        assert response.status_code == 413
        assert response.json()["error"]["code"] == "body_too_large"


def test_full_budget_is_429_and_a_stuck_replica_is_504(gateway, tiny_replica):
    with gateway.client(headers=KEY) as http:
        alone_too_big = http.post("/embed", json={"inputs": ["word " * 40, "word " * 40]})
    assert alone_too_big.status_code == 413  # can never fit: not a retryable 429
    os.kill(tiny_replica.process.pid, signal.SIGSTOP)
    try:
        held: dict[str, httpx.Response] = {}
        holder = threading.Thread(target=lambda: held.update(
            r=gateway.client(headers=KEY).post("/embed", json={"inputs": "word " * 20})))
        holder.start()
        with gateway.client(headers=KEY) as http:
            for _ in range(400):
                if metric_value(http.get("/metrics").text, "embedserve_gateway_inflight_tokens") > 0:
                    break
                time.sleep(0.01)
            refused = http.post("/embed", json={"inputs": "word " * 50})
        holder.join(30)
    finally:
        os.kill(tiny_replica.process.pid, signal.SIGCONT)
    assert refused.status_code == 429, refused.text
    assert refused.headers["retry-after"] == "1"
    assert refused.json()["error"]["type"] == "rate_limit_error"
    assert held["r"].status_code == 504, held["r"].text
    with gateway.client(headers=KEY) as http:
        assert http.post("/embed", json={"inputs": "word " * 50}).status_code == 200


def test_no_replica_is_503(tiny_bert_dir):
    # bound and not listening for the whole test: refused, and no other test's server can
    # take the port meanwhile
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        closed = f"127.0.0.1:{sock.getsockname()[1]}"
        gateway = GatewayServer(gateway_settings(tiny_bert_dir, [closed]))
        try:
            _check_unavailable(gateway)
        finally:
            gateway.stop()


def _check_unavailable(gateway: GatewayServer) -> None:
    with gateway.client() as http:
        assert http.get("/health").status_code == 200
        assert http.get("/ready").status_code == 503
        response = http.post("/v1/embeddings", json={"input": "x"})
    assert response.status_code == 503
    assert response.json()["error"]["type"] == "service_unavailable"
    assert int(response.headers["retry-after"]) >= 1      # clients back off, then retry
    with pytest.raises(openai.InternalServerError):
        openai.OpenAI(base_url=gateway.url + "/v1", api_key="x", max_retries=0).embeddings.create(
            input="x", model=gateway.settings.model_dir.name)


def test_unexpected_error_is_a_clean_500(gateway, caplog: pytest.LogCaptureFixture):
    async def broken() -> None:
        raise RuntimeError("secret internals")

    gateway.app.add_api_route("/broken", broken, methods=["GET"])
    with caplog.at_level(logging.ERROR), gateway.client(headers=KEY) as http:
        response = http.get("/broken")
        assert http.get("/health").status_code == 200  # and the server keeps serving
    assert response.status_code == 500
    assert response.json() == {"error": {"message": "internal server error", "type": "server_error",
                                         "param": None, "code": "internal_error"}}
    assert "secret" not in response.text and response.headers["x-request-id"]
    # logged once, with its traceback, whichever layer answered
    logged = [r for r in caplog.records if r.exc_info and "secret internals" in str(r.exc_info[1])]
    assert len(logged) == 1, [r.getMessage() for r in logged]
