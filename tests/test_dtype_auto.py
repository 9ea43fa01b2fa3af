"""``--dtype auto``, the default of serve, scheduler, embed and LocalEmbedder.

The expectation is computed from the same capability facts the engine reads
(``torch.cpu.get_capabilities()``), so these tests hold on a CPU without
native bf16 too (auto must then say float32 and why). Servers are real
(``embedserve serve`` / ``embedserve scheduler`` processes), models are real
(the default multilingual-e5-small against sentence-transformers' vectors,
tiny random checkpoints), and every probe is the real one.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import grpc
import httpx
import numpy as np
import pyarrow.parquet as pq
import pytest

from bulk_corpus import documents, write_jsonl
from embedserve.cli import main
from embedserve.engine.dtype_choice import (
    DtypeChoice,
    auto_candidate,
    cpu_capabilities,
    cpuinfo_capabilities,
    native_bf16_feature,
    probe_verdict,
    score_bound,
)
from embedserve.entrypoint import GATEWAY_LISTENING
from embedserve.launch.processes import popen_listening, stop_popen
from embedserve.local.columns import embedding_matrix
from embedserve.local.embedder import LocalEmbedder
from embedserve.protos import inference_pb2, inference_pb2_grpc
from gateway_harness import SchedulerProcess
from serve_harness import ROOT, wait_ready

FEATURE = native_bf16_feature(cpu_capabilities())   # what this machine has: "amx_bf16", ... or None
NO_BF16_REASON = "auto: cpu has no native bf16 (amx_bf16 or avx512_bf16)"


def check_auto(dtype: str, reason: str) -> None:
    """What auto may report on this machine: its hardware fact, then the probe's verdict."""
    if FEATURE is None:
        assert (dtype, reason) == ("float32", NO_BF16_REASON)
        return
    assert reason.startswith(f"auto: cpu has {FEATURE}"), reason
    if dtype == "bfloat16":
        assert " >= " in reason or " <= " in reason, reason
    else:
        assert dtype == "float32" and reason.endswith(": float32"), reason


# --- the rule and the verdict, on given facts ---------------------------------------

@pytest.mark.parametrize("device, capabilities, dtype, reason", [
    ("cpu", {"amx_bf16": True, "avx512_bf16": True}, "bfloat16", "auto: cpu has amx_bf16"),
    ("cpu", {"avx512_bf16": True, "avx512_f": True}, "bfloat16", "auto: cpu has avx512_bf16"),
    # AVX-512 without BF16: oneDNN would emulate bf16, slower than float32.
    ("cpu", {"avx512_f": True, "avx512_bw": True}, "float32", NO_BF16_REASON),
    ("cpu", {}, "float32", NO_BF16_REASON),
    ("cuda:0", {}, "bfloat16", "auto: cuda"),
])
def test_auto_candidate_follows_the_hardware(device, capabilities, dtype, reason) -> None:
    assert auto_candidate(device, capabilities) == DtypeChoice(dtype, reason)


@pytest.mark.skipif(not Path("/proc/cpuinfo").is_file(), reason="no /proc/cpuinfo here")
def test_the_cpuinfo_fallback_agrees_with_torch() -> None:
    flags = cpuinfo_capabilities(Path("/proc/cpuinfo").read_text())
    assert native_bf16_feature(flags) == FEATURE


def test_the_embedding_verdict_is_the_smallest_row_cosine() -> None:
    reference = np.eye(3, 8, dtype=np.float32) + 0.1
    close = reference.copy()
    close[1, 5] += 0.005                            # one row moved a little: cosine ~0.99996
    cosine = float(close[1] @ reference[1] / np.linalg.norm(close[1]) / np.linalg.norm(reference[1]))
    candidate = DtypeChoice("bfloat16", "auto: cpu has amx_bf16")
    kept = probe_verdict(candidate, reference, close, min_cosine=cosine - 1e-6)
    assert kept.dtype == "bfloat16" and kept.reason.startswith("auto: cpu has amx_bf16; probe min cosine")
    dropped = probe_verdict(candidate, reference, close, min_cosine=cosine + 1e-6)
    assert dropped.dtype == "float32"
    assert dropped.reason == (f"auto: cpu has amx_bf16, but bfloat16 probe min cosine "
                              f"{np.floor(cosine * 1e6) / 1e6:.6f} < {cosine + 1e-6:g}: float32")


def test_the_score_verdict_bounds_the_sigmoid_move() -> None:
    candidate = DtypeChoice("bfloat16", "auto: cuda")
    logits = np.array([-3.0, 0.0, 2.5], dtype=np.float32)
    moved = logits + np.array([0.0, 0.04, 0.0], dtype=np.float32)   # sigmoid'(0) = 1/4: moves 0.01
    assert score_bound(0.9999) == pytest.approx(0.0141421, abs=1e-6)
    assert probe_verdict(candidate, logits, moved, 0.9999).dtype == "bfloat16"
    assert probe_verdict(candidate, logits, moved, 0.99996).dtype == "float32"   # bound 0.0089
    assert probe_verdict(candidate, logits, logits, 1.0).dtype == "bfloat16"     # identical passes 1


@pytest.mark.parametrize("command", [["serve"], ["cluster"], ["scheduler"], ["embed", "in.jsonl", "-o", "out.parquet"]])
def test_a_probe_bar_outside_zero_to_one_is_a_usage_error(command: list[str], capsys) -> None:
    with pytest.raises(SystemExit) as exited:
        main([*command, "--dtype-probe-min-cosine", "1.5"])
    assert exited.value.code == 2
    assert "--dtype-probe-min-cosine: must be between 0 and 1, got 1.5" in capsys.readouterr().err


def test_launchers_pass_dtype_flags_on_only_when_not_the_default(tmp_path: Path) -> None:
    from embedserve.cli import build_parser
    from embedserve.scheduler.cli import engine_flags, settings_from_args

    assert engine_flags("auto", True, 0.9999) == ()
    flags = engine_flags("bfloat16", True, 0.99995)
    assert flags == ("--dtype", "bfloat16", "--dtype-probe-min-cosine", "0.99995")
    settings = settings_from_args(build_parser().parse_args(["scheduler", *flags]), tmp_path)
    assert (settings.dtype, settings.dtype_probe_min_cosine) == ("bfloat16", 0.99995)


# --- real servers, real models ------------------------------------------------------

def serve(*args: str) -> tuple:
    """``embedserve serve --port 0 --replicas 1 ARGS``: no --dtype unless ARGS give one."""
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT), PYTHONUNBUFFERED="1")
    process, match = popen_listening([sys.executable, "-m", "embedserve.cli", "serve", "--port", "0",
                                      "--replicas", "1", *args], GATEWAY_LISTENING, env=env,
                                     cwd=str(ROOT))
    url = match.group(1)
    wait_ready(url)
    return process, url


def test_serve_defaults_to_auto_and_says_why(default_model_dir: Path, probe_reference) -> None:
    process, url = serve("--model", str(default_model_dir))
    try:
        info = httpx.get(url + "/info", timeout=30).json()
        check_auto(info["model_dtype"], info["dtype_reason"])
        # The default model in bf16 passes the probe wherever the CPU has native bf16.
        assert info["model_dtype"] == ("bfloat16" if FEATURE else "float32"), info["dtype_reason"]
        reply = httpx.post(url + "/v1/embeddings", json={"input": list(probe_reference.texts)},
                           timeout=120)
        assert reply.status_code == 200
        vectors = np.array([item["embedding"] for item in reply.json()["data"]], dtype=np.float32)
        cosines = (vectors * probe_reference.vectors).sum(axis=1) / np.linalg.norm(vectors, axis=1)
        assert cosines.min() >= 0.9999, cosines
        if FEATURE:   # bf16 really runs: float32 matches sentence-transformers to ~1e-6
            assert np.abs(vectors - probe_reference.vectors).max() > 1e-4
    finally:
        assert stop_popen(process, 60) == 0


def test_a_probe_bar_of_one_falls_back_to_float32_with_the_reason(tiny_bert_dir: Path) -> None:
    process, url = serve("--model", str(tiny_bert_dir), "--dtype-probe-min-cosine", "1")
    try:
        info = httpx.get(url + "/info", timeout=30).json()
        assert info["model_dtype"] == "float32"
        reason = info["dtype_reason"]
        if FEATURE:   # the probe ran, measured a cosine below 1, and said so
            assert reason.startswith(f"auto: cpu has {FEATURE}, but bfloat16 probe min cosine 0.9")
            assert reason.endswith(" < 1: float32"), reason
        else:
            assert reason == NO_BF16_REASON
    finally:
        assert stop_popen(process, 60) == 0


def grpc_info(address: str) -> inference_pb2.InfoResponse:
    with grpc.insecure_channel(address) as channel:
        return inference_pb2_grpc.InferenceStub(channel).Info(inference_pb2.InfoRequest(), timeout=30)


def test_a_cross_encoder_is_probed_on_its_scores(tiny_reranker_dir: Path) -> None:
    replica = SchedulerProcess(tiny_reranker_dir, "--dtype", "auto", threads=1)
    try:
        info = grpc_info(replica.address)
        check_auto(info.dtype, info.dtype_reason)
        if FEATURE:
            assert "probe max |d sigmoid| " in info.dtype_reason, info.dtype_reason
    finally:
        replica.stop()


def test_an_explicit_dtype_is_kept_and_reported(tiny_bert_dir: Path, tiny_bert_replica) -> None:
    # float32: the session's shared replica, which the harness starts with --dtype float32.
    info = grpc_info(tiny_bert_replica.address)
    assert (info.dtype, info.dtype_reason) == ("float32", "explicit")
    # bfloat16 is kept even under a probe bar it would fail.
    replica = SchedulerProcess(tiny_bert_dir, "--dtype", "bfloat16", "--dtype-probe-min-cosine", "1",
                               threads=1)
    try:
        info = grpc_info(replica.address)
        assert (info.dtype, info.dtype_reason) == ("bfloat16", "explicit")
    finally:
        replica.stop()


# --- in process: LocalEmbedder and embedserve embed -----------------------------------

def test_local_embedder_defaults_to_auto(default_model_dir: Path, probe_reference) -> None:
    embedder = LocalEmbedder(default_model_dir)
    try:
        check_auto(embedder.info.dtype, embedder.info.dtype_reason)
        assert embedder.info.dtype == ("bfloat16" if FEATURE else "float32")
        part = embedder.embed(list(probe_reference.texts))
        vectors = np.asarray(part.stored, dtype=np.float32)
        cosines = (vectors * probe_reference.vectors).sum(axis=1) / np.linalg.norm(vectors, axis=1)
        assert cosines.min() >= 0.9999, cosines
    finally:
        embedder.close()


def test_bulk_embed_defaults_to_auto(tmp_path: Path, tiny_bert_dir: Path) -> None:
    source = write_jsonl(tmp_path / "in.jsonl", documents(40))
    resolved = LocalEmbedder(tiny_bert_dir)
    dtype = resolved.info.dtype
    check_auto(dtype, resolved.info.dtype_reason)
    resolved.close()

    def run(name: str, *extra: str) -> np.ndarray:
        output = tmp_path / f"{name}.parquet"
        assert main(["embed", str(source), "-o", str(output), "--model", str(tiny_bert_dir),
                     "--no-progress", *extra]) == 0
        return embedding_matrix(pq.read_table(output).column("embedding"), "float32")

    default = run("default")
    assert np.array_equal(default, run("explicit", "--dtype", dtype))
    if dtype == "bfloat16":
        assert not np.array_equal(default, run("float32", "--dtype", "float32"))


@pytest.mark.parametrize("capability, dtype", [((7, 5), "float16"), ((8, 0), "bfloat16"), ((9, 0), "bfloat16")])
def test_cuda_picks_bfloat16_only_where_the_device_computes_in_it(capability: tuple[int, int], dtype: str) -> None:
    from embedserve.engine.engine import resolve_dtype

    choice = auto_candidate("cuda", cuda_capability=capability)
    assert choice.dtype == dtype and f"{capability[0]}.{capability[1]}" in choice.reason
    assert resolve_dtype(None, "cuda", capability) == dtype
    assert resolve_dtype("bfloat16", "cuda", (7, 5)) == "bfloat16"   # an explicit choice stays
