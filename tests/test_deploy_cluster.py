"""``embedserve cluster`` runs the compose topology for real, as local processes.

One run of the real command (2 replicas + a gateway process, default model):
answers match sentence-transformers and both replicas serve; the container
healthcheck probe (``python -m embedserve.healthprobe``) reports the live
gateway and replica healthy and closed ports unhealthy; a replica
killed with SIGKILL is restarted on its port and serves again; SIGTERM sent
under load (tests/sigterm_load.py: the same check tests/test_launch_shutdown.py
makes of ``serve`` and ``gateway``) loses no request and stops the whole tree
with status 0, leaving no process behind.

A second run serves two models (a tiny BERT embedder and a tiny XLM-R
cross-encoder, one replica each): each route's answers match transformers
for its own model, and the reranker's replica, killed, is restarted by its
model's supervisor while the embedder's keeps running.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

from embedserve.entrypoint import SCHEDULER_LISTENING
from embedserve.launch.processes import free_port
from gateway_harness import metric_value
from process_tree import alive, children
from sigterm_load import assert_nothing_lost, sigterm_under_load
from tests.faults.load import LoadGenerator

_READY = "embedserve cluster: gateway "


class ClusterProcess:
    """The ``embedserve cluster`` process and the lines it printed (read by a thread)."""

    def __init__(self, argv: list[str]) -> None:
        env = dict(os.environ, PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1")
        self.popen = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                      text=True, env=env, start_new_session=True)
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.popen.stdout is not None
        for line in self.popen.stdout:
            self.lines.append(line)

    def wait_for(self, predicate, timeout_s: float) -> list[str]:  # noqa: ANN001
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            found = [line for line in list(self.lines) if predicate(line)]
            if found:
                return found
            if self.popen.poll() is not None:
                break
            time.sleep(0.1)
        pytest.fail("embedserve cluster did not print the expected line; output:\n"
                    + "".join(self.lines[-60:]))

    def replica_lines(self) -> list[tuple[str, str]]:
        return [m.groups() for line in list(self.lines) if (m := SCHEDULER_LISTENING.search(line))]


def _calls_ok(metrics_address: str) -> float:
    body = httpx.get(f"http://{metrics_address}/metrics", timeout=5, trust_env=False).text
    return metric_value(body, "embedserve_scheduler_calls_total", code="OK", method="Embed")


def _healthprobe(target: str) -> int:
    return subprocess.run([sys.executable, "-m", "embedserve.healthprobe", target, "--timeout", "5"],
                          capture_output=True, timeout=30).returncode


async def _send(url: str, expected, requests: int) -> dict[str, int]:  # noqa: ANN001
    async with httpx.AsyncClient(trust_env=False, timeout=10) as client:
        model = (await client.get(f"{url}/v1/models")).json()["data"][0]["id"]
    load = LoadGenerator(url, model, expected, concurrency=0)
    async with load:
        # All at once, so that least-outstanding balancing has load to spread.
        await asyncio.gather(*(load.send_one() for _ in range(requests)))
    o = load.phase
    return {"sent": o.sent, "correct": o.correct, "retryable": o.retryable, "wrong": o.wrong,
            "lost": o.lost, "examples": len(o.wrong_examples)}


def test_cluster_serves_survives_a_killed_replica_and_stops_cleanly(default_model_dir: Path,
                                                                      probe_reference) -> None:
    port = free_port()
    # --auto-truncate is a gateway flag: cluster passes it on to its gateway process.
    cluster = ClusterProcess([sys.executable, "-m", "embedserve.cli", "cluster", "--replicas", "2",
                              "--model", str(default_model_dir), "--port", str(port),
                              "--auto-truncate", "left", "--dtype", "float32"])
    url = f"http://127.0.0.1:{port}"
    try:
        cluster.wait_for(lambda line: line.startswith(_READY), timeout_s=240)
        replicas = cluster.replica_lines()
        assert len(replicas) == 2 and replicas[0][0] != replicas[1][0]

        counts = asyncio.run(_send(url, probe_reference, requests=40))
        assert counts == {"sent": 40, "correct": 40, "retryable": 0, "wrong": 0, "lost": 0,
                          "examples": 0}
        # Least-outstanding balancing spread the calls over both replicas.
        assert all(_calls_ok(metrics) > 0 for _, metrics in replicas)
        # Without the flag this input would be refused with 413; the gateway cuts it instead.
        long_input = httpx.post(f"{url}/v1/embeddings", json={"input": "word " * 700},
                                timeout=60, trust_env=False)
        assert long_input.status_code == 200, long_input.text
        assert long_input.json()["usage"]["prompt_tokens"] == 512

        # The container healthchecks' probe agrees with the live processes.
        assert _healthprobe(f"{url}/ready") == 0
        assert _healthprobe(f"grpc://{replicas[0][0]}") == 0
        assert _healthprobe(f"grpc://127.0.0.1:{free_port()}") == 1
        assert _healthprobe(f"http://127.0.0.1:{free_port()}/ready") == 1
        assert _healthprobe("ftp://example") == 2

        # Kill one replica outright: the cluster restarts it on the same port.
        victim = next(pid for pid in children(cluster.popen.pid)
                      if "scheduler" in Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace"))
        os.kill(victim, signal.SIGKILL)
        cluster.wait_for(lambda line: len(cluster.replica_lines()) >= 3, timeout_s=120)
        restarted_address, restarted_metrics = cluster.replica_lines()[-1]
        assert restarted_address in {address for address, _ in replicas}
        deadline = time.monotonic() + 60
        while _calls_ok(restarted_metrics) == 0 and time.monotonic() < deadline:
            counts = asyncio.run(_send(url, probe_reference, requests=10))
            assert counts["wrong"] == 0 and counts["lost"] == 0, counts
        assert _calls_ok(restarted_metrics) > 0, "the restarted replica never got a call"

        # SIGTERM under load (tests/sigterm_load.py) stops everything with status 0 and
        # loses no request: those admitted before it are answered, later ones get 503.
        tree = [cluster.popen.pid, *children(cluster.popen.pid)]
        tally = sigterm_under_load(cluster.popen, url)
        assert cluster.popen.wait(90) == 0, "".join(cluster.lines[-40:])
        assert_nothing_lost(tally)
        deadline = time.monotonic() + 10
        while any(alive(pid) for pid in tree) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not any(alive(pid) for pid in tree)
    finally:
        if cluster.popen.poll() is None:
            os.killpg(cluster.popen.pid, signal.SIGKILL)
            cluster.popen.wait(10)


def _embedder_reference(model_dir: Path, texts: list[str]):  # noqa: ANN202
    """Mean-pooled, normalized vectors from transformers (the tiny BERT's sentence-transformers recipe)."""
    import numpy as np
    import tokenizers
    import torch
    import transformers

    tokenizer = tokenizers.Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    model = transformers.AutoModel.from_pretrained(model_dir).eval()
    rows = []
    for text in texts:
        with torch.no_grad():
            hidden = model(input_ids=torch.tensor([tokenizer.encode(text).ids])).last_hidden_state[0]
        mean = hidden.mean(0).numpy()
        rows.append(mean / np.linalg.norm(mean))
    return np.array(rows)


def _reranker_reference(model_dir: Path, query: str, docs: list[str]):  # noqa: ANN202
    import numpy as np
    import tokenizers
    import torch
    import transformers

    tokenizer = tokenizers.Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    model = transformers.AutoModelForSequenceClassification.from_pretrained(model_dir).eval()
    with torch.no_grad():
        return np.array([model(input_ids=torch.tensor([tokenizer.encode(query, doc).ids])).logits[0, 0].item()
                         for doc in docs])


def test_cluster_serves_two_models_and_restarts_each_models_replica(tiny_bert_dir: Path,
                                                                    tiny_reranker_dir: Path) -> None:
    import numpy as np

    texts, query, docs = ["one cluster", "two models"], "where?", ["here", "Paris", "nowhere at all"]
    port = free_port()
    cluster = ClusterProcess([sys.executable, "-m", "embedserve.cli", "cluster", "--replicas", "1",
                              "--port", str(port), "--model", f"{tiny_bert_dir}:name=embed",
                              "--model", f"{tiny_reranker_dir}:name=rerank", "--dtype", "float32"])
    url = f"http://127.0.0.1:{port}"

    def check_answers(http: httpx.Client) -> None:
        embedded = http.post("/v1/embeddings", json={"input": texts})
        assert embedded.status_code == 200 and embedded.json()["model"] == "embed", embedded.text
        np.testing.assert_allclose([d["embedding"] for d in embedded.json()["data"]],
                                   _embedder_reference(tiny_bert_dir, texts), atol=1e-5)
        ranked = http.post("/rerank", json={"query": query, "texts": docs, "raw_scores": True})
        assert ranked.status_code == 200, ranked.text
        logits = _reranker_reference(tiny_reranker_dir, query, docs)
        np.testing.assert_allclose([r["score"] for r in ranked.json()], logits[[r["index"] for r in ranked.json()]],
                                   atol=1e-4)

    try:
        cluster.wait_for(lambda line: line.startswith(_READY), timeout_s=240)
        assert len(cluster.replica_lines()) == 2
        with httpx.Client(base_url=url, timeout=60, trust_env=False) as http:
            assert [m["id"] for m in http.get("/v1/models").json()["data"]] == ["embed", "rerank"]
            assert http.get("/ready").json()["models"] == {"embed": 1, "rerank": 1}
            check_answers(http)
            wrong = http.post("/v1/rerank", json={"query": query, "documents": docs, "model": "embed"})
            assert wrong.status_code == 400 and "cannot rerank" in wrong.json()["error"]["message"]

            # Kill the reranker's replica: its supervisor restarts it, the embedder's is untouched.
            def serving(pid: int) -> str:
                return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
            replicas = [pid for pid in children(cluster.popen.pid) if "scheduler" in serving(pid)]
            (victim,) = [pid for pid in replicas if str(tiny_reranker_dir) in serving(pid)]
            (embedder,) = [pid for pid in replicas if str(tiny_bert_dir) in serving(pid)]
            os.kill(victim, signal.SIGKILL)
            cluster.wait_for(lambda line: len(cluster.replica_lines()) >= 3, timeout_s=120)
            deadline = time.monotonic() + 60
            while http.get("/ready").status_code != 200 and time.monotonic() < deadline:
                time.sleep(0.1)
            assert http.get("/ready").json()["models"] == {"embed": 1, "rerank": 1}
            assert alive(embedder) and embedder in children(cluster.popen.pid)
            check_answers(http)

        tree = [cluster.popen.pid, *children(cluster.popen.pid)]
        cluster.popen.send_signal(signal.SIGTERM)
        assert cluster.popen.wait(90) == 0, "".join(cluster.lines[-40:])
        deadline = time.monotonic() + 10
        while any(alive(pid) for pid in tree) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not any(alive(pid) for pid in tree)
    finally:
        if cluster.popen.poll() is None:
            os.killpg(cluster.popen.pid, signal.SIGKILL)
            cluster.popen.wait(10)
