"""``--dtype`` on ``embedserve serve`` and ``embedserve cluster`` reaches the replicas.

``serve --dtype bfloat16`` runs the default model (multilingual-e5-small) in
bf16 behind the real gateway: /info must report bfloat16 from the replica
itself, and /v1/embeddings must stay within cosine 0.999 of
sentence-transformers in float32 (``probe_reference``), while not being the
float32 answer (which would mean the flag was dropped); with ``--no-calibration``
it refuses int8 and still serves binary. ``cluster`` is checked on a tiny random
model: its replicas report the dtype they were started with, and
``--no-calibration`` reaches them too.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time

import httpx
import numpy as np

BANNER = re.compile(r"(?:listening on|gateway) (http://[\d.]+:\d+)")


def start(argv: list[str], timeout_s: float = 300.0) -> tuple[subprocess.Popen, str]:
    """Start an embedserve command; return it and its gateway URL once it prints one."""
    process = subprocess.Popen([sys.executable, "-m", "embedserve.cli", *argv],
                               stdout=subprocess.PIPE, text=True,
                               env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert process.stdout is not None
    deadline = time.monotonic() + timeout_s
    for line in process.stdout:
        match = BANNER.search(line)
        if match:
            threading.Thread(target=process.stdout.read, daemon=True).start()
            return process, match.group(1)
        if time.monotonic() > deadline:
            break
    process.kill()
    raise AssertionError(f"{argv[0]} never printed its URL")


def stop(process: subprocess.Popen) -> None:
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            assert process.wait(60) == 0
        finally:
            if process.poll() is None:
                process.kill()
                process.wait()


def replica_dtype(url: str) -> str | None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        dtype = httpx.get(url + "/info", timeout=10).json().get("model_dtype")
        if dtype is not None:
            return dtype
        time.sleep(0.1)
    return None


def test_serve_bfloat16_stays_close_to_float32_reference(default_model_dir, probe_reference):
    # --no-calibration: no int8/uint8 ranges computed at start-up (in emulated bf16 on a
    # CPU without it, most of this test's time); those precisions are refused instead.
    process, url = start(["serve", "--model", str(default_model_dir), "--port", "0",
                          "--dtype", "bfloat16", "--no-calibration"])
    try:
        assert replica_dtype(url) == "bfloat16"
        info = httpx.get(url + "/info", timeout=10).json()
        assert info["quantization"]["calibration_id"] is None
        refused = httpx.post(url + "/v1/embeddings", json={"input": "x", "embedding_types": ["int8"]},
                             timeout=60)
        assert refused.status_code == 400 and "calibration" in refused.json()["error"]["message"]
        ubinary = httpx.post(url + "/v1/embeddings", json={"input": "x", "embedding_types": ["ubinary"]},
                             timeout=60)
        assert ubinary.status_code == 200, ubinary.text
        texts = list(probe_reference.texts)
        reply = httpx.post(url + "/v1/embeddings", json={"input": texts}, timeout=120)
        assert reply.status_code == 200
        vectors = np.array([item["embedding"] for item in reply.json()["data"]], dtype=np.float32)
        assert vectors.shape == probe_reference.vectors.shape
        cosines = (vectors * probe_reference.vectors).sum(axis=1) / np.linalg.norm(vectors, axis=1)
        assert cosines.min() >= 0.999, cosines
        # float32 matches the reference to ~1e-6; bf16 rounding must show.
        assert np.abs(vectors - probe_reference.vectors).max() > 1e-4
    finally:
        stop(process)


def test_cluster_passes_dtype_and_no_calibration_to_its_replicas(tiny_bert_dir):
    process, url = start(["cluster", "--replicas", "1", "--model", str(tiny_bert_dir),
                          "--port", "0", "--dtype", "bfloat16", "--no-calibration"])
    try:
        assert replica_dtype(url) == "bfloat16"
        assert httpx.get(url + "/info", timeout=10).json()["quantization"]["calibration_id"] is None
        reply = httpx.post(url + "/v1/embeddings", json={"input": ["cluster in bf16"]}, timeout=60)
        assert reply.status_code == 200
        assert len(reply.json()["data"][0]["embedding"]) == 32
    finally:
        stop(process)
