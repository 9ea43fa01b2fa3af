"""The benchmark suite: its checks reject wrong answers, and ``--quick`` runs end to end.

The end-to-end test runs ``python -m bench suite --quick`` for real (the
default model, ``embedserve serve`` as a child process, real HTTP clients)
against two broken OpenAI-compatible servers started here on 127.0.0.1: one
answers vectors of the wrong dimension, one answers well-formed vectors that
are wrong. Both must be reported FAILED with no figures, while embedserve
gets a row of numbers in every workload. No figure is asserted (timing
belongs to the report, not to tests).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import numpy as np
import pytest

from bench.suite.checks import BadAnswer, check_embeddings, check_scores
from bench.suite.clients import parse_embeddings, parse_rerank
from bench.suite.report import write_section
from tests.conftest import ROOT, SHARED_DATA, shared_file

WORKLOADS = ("latency", "rerank", "throughput", "concurrency")
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _unit(rows: int, dim: int, seed: int) -> np.ndarray:
    vectors = np.random.default_rng(seed).standard_normal((rows, dim)).astype(np.float32)
    return vectors / np.linalg.norm(vectors, axis=1, keepdims=True)


# --- the checks, one property each -------------------------------------------

def test_check_embeddings_accepts_the_reference_itself():
    expected = _unit(3, 8, 0)
    assert check_embeddings(expected * 2.0, expected, 0.999) == pytest.approx(1.0, abs=1e-6)


@pytest.mark.parametrize("answer, message", [
    (_unit(2, 8, 0), "2 vectors for 3 inputs"),
    (_unit(3, 7, 0), "dimension 7, expected 8"),
    (_unit(3, 8, 1), "cosine"),
])
def test_check_embeddings_rejects_wrong_answers(answer, message):
    with pytest.raises(BadAnswer, match=message):
        check_embeddings(answer, _unit(3, 8, 0), 0.99)


def test_check_embeddings_rejects_nan():
    answer = _unit(3, 8, 0)
    answer[1, 2] = np.nan
    with pytest.raises(BadAnswer, match="non-finite"):
        check_embeddings(answer, _unit(3, 8, 0), 0.99)


def test_check_scores_accepts_sigmoid_and_logit_scales_and_rejects_other_scores():
    logits = np.array([2.0, -1.0, 0.5])
    assert check_scores(1 / (1 + np.exp(-logits)), logits, 0.005) < 1e-9
    assert check_scores(logits.copy(), logits, 0.005) < 1e-9
    with pytest.raises(BadAnswer, match="off by"):
        check_scores(np.full(3, 0.5), logits, 0.005)
    with pytest.raises(BadAnswer, match="2 scores for 3"):
        check_scores(np.zeros(2), logits, 0.005)


def test_parse_embeddings_orders_by_index_and_rejects_gaps():
    payload = {"data": [{"index": 1, "embedding": [0.0, 1.0]}, {"index": 0, "embedding": [1.0, 0.0]}]}
    assert parse_embeddings(payload, 2).tolist() == [[1.0, 0.0], [0.0, 1.0]]
    with pytest.raises(BadAnswer, match="not 0..1"):
        parse_embeddings({"data": [{"index": 0, "embedding": [1.0]}, {"index": 0, "embedding": [1.0]}]}, 2)
    with pytest.raises(BadAnswer, match="not an OpenAI"):
        parse_embeddings({"error": "nope"}, 1)


def test_parse_rerank_maps_scores_back_to_document_order():
    payload = {"results": [{"index": 2, "relevance_score": 0.9}, {"index": 0, "relevance_score": 0.5},
                           {"index": 1, "relevance_score": 0.1}]}
    assert parse_rerank(payload, 3).tolist() == [0.5, 0.1, 0.9]
    with pytest.raises(BadAnswer, match="not 0..2"):
        parse_rerank({"results": [{"index": 0, "relevance_score": 0.5}]}, 3)


def test_write_section_replaces_only_its_block_and_keeps_notes(tmp_path: Path):
    report = tmp_path / "B.md"
    report.write_text("# B\n\n<!-- section: other -->\nkeep\n<!-- end: other -->\n")
    write_section(report, "suite", "first\n")
    assert report.read_text().endswith("<!-- section: suite -->\nfirst\n<!-- end: suite -->\n")
    text = report.read_text().replace("first\n", "first\n<!-- notes -->\nmine\n<!-- end notes -->\n")
    report.write_text(text)
    write_section(report, "suite", "second\n")
    text = report.read_text()
    assert "keep" in text and "second" in text and "first" not in text
    assert "<!-- notes -->\nmine\n<!-- end notes -->" in text
    assert text.count("<!-- section: suite -->") == 1


def test_serve_command_reaches_the_replica_with_device_dtype_and_graph_switch(tmp_path: Path):
    """What `bench suite --profile gpu` relies on: the suite's `serve` argv parses, and the replica gets the flags."""
    from bench.suite.systems import serve_command
    from embedserve.cli import build_parser
    from embedserve.scheduler.cli import engine_flags, settings_from_args

    argv = serve_command(tmp_path, 8123, "cuda:0", "float32", cuda_graphs=False)
    serve = build_parser().parse_args(argv[argv.index("serve"):])
    assert (serve.device, serve.dtype, serve.cuda_graphs, serve.port) == ("cuda:0", "float32", False, 8123)
    replica = build_parser().parse_args(["scheduler", "--model", str(tmp_path), "--device", serve.device,
                                         *engine_flags(serve.dtype, serve.cuda_graphs)])
    settings = settings_from_args(replica, tmp_path)
    assert (settings.device, settings.dtype, settings.cuda_graphs) == ("cuda:0", "float32", False)
    default = build_parser().parse_args(serve_command(tmp_path, 1, "cpu", None)[3:])
    assert default.cuda_graphs is True and engine_flags(default.dtype, default.cuda_graphs) == ()


def test_an_explicit_system_the_default_already_measured_is_skipped():
    from bench.suite.results import SystemOutcome
    from bench.suite.run import measured_twin
    from bench.suite.systems import serving_configuration

    bf16 = serving_configuration("cpu", "bfloat16", cuda_graphs=True)
    default = SystemOutcome("embedserve default", configuration=bf16)
    measured = [SystemOutcome("infinity-emb (torch bf16, cpu)"), default]
    assert measured_twin(bf16, measured) is default
    assert measured_twin(serving_configuration("cpu", "float32", True), measured) is None
    assert measured_twin("", measured) is None                      # peers carry no configuration
    # CUDA graphs tell systems apart on CUDA only.
    assert serving_configuration("cpu", "float32", False) == serving_configuration("cpu", "float32", True)
    assert serving_configuration("cuda", "float32", False) != serving_configuration("cuda", "float32", True)
    default.unavailable = "exited with status 1"                    # not measured: nothing to skip for
    assert measured_twin(bf16, measured) is None


def test_rounds_pool_each_rows_samples():
    from bench.suite.results import Row
    from bench.suite.run import pooled_rows

    rounds = [
        [Row("a", "throughput", "512 tokens", 512, texts=10, tokens=5_120, seconds=2.0, worst_agreement=0.9999),
         Row("a", "concurrency", "8 clients", 8, latencies_ms=[10.0, 30.0], texts=2),
         Row("a", "rerank", "5 docs", 5, latencies_ms=[5.0], worst_agreement=0.01),
         Row("b", "latency", "128 tokens", 128, skipped="unavailable (see systems)")],
        [Row("a", "throughput", "512 tokens", 512, texts=30, tokens=15_360, seconds=2.0, worst_agreement=0.9998,
             failures=1, failure="wrong vector"),
         Row("a", "concurrency", "8 clients", 8, latencies_ms=[20.0], texts=1),
         Row("a", "rerank", "5 docs", 5, latencies_ms=[7.0], worst_agreement=0.03),
         Row("b", "latency", "128 tokens", 128, latencies_ms=[40.0], texts=1)],
    ]
    pooled = {(row.system, row.label): row for row in pooled_rows(rounds[0] + rounds[1])}
    assert len(pooled) == 4
    throughput = pooled["a", "512 tokens"]
    assert (throughput.texts, throughput.tokens, throughput.seconds) == (40, 20_480, 4.0)
    assert (throughput.failures, throughput.failure) == (1, "wrong vector")
    assert throughput.worst_agreement == 0.9998                      # the smallest cosine
    assert pooled["a", "5 docs"].worst_agreement == 0.03             # the largest score error
    assert sorted(pooled["a", "8 clients"].latencies_ms) == [10.0, 20.0, 30.0]
    assert pooled["b", "128 tokens"].latencies_ms == [40.0]          # measured in one round: measured
    assert not pooled["b", "128 tokens"].skipped
    assert rounds[0][1].latencies_ms == [10.0, 30.0]                 # the rounds' own rows are left as they were


# --- the quick suite, for real ------------------------------------------------

class _BrokenEmbeddings(BaseHTTPRequestHandler):
    """An OpenAI-shaped /v1/embeddings that answers fast and wrong."""

    dimension = 384
    seed = 0

    def do_POST(self) -> None:  # noqa: N802 (http.server's naming)
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        texts = body["input"] if isinstance(body["input"], list) else [body["input"]]
        vectors = _unit(len(texts), self.dimension, self.seed)
        payload = json.dumps({"object": "list", "model": body.get("model"), "data": [
            {"object": "embedding", "index": i, "embedding": v.tolist()} for i, v in enumerate(vectors)]})
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload.encode())

    def log_message(self, *args) -> None:
        pass


@pytest.fixture
def broken_servers() -> Iterator[dict[str, str]]:
    wrong_dimension = type("WrongDimension", (_BrokenEmbeddings,), {"dimension": 383})
    wrong_vectors = type("WrongVectors", (_BrokenEmbeddings,), {"dimension": 384, "seed": 7})
    servers = {name: ThreadingHTTPServer(("127.0.0.1", 0), handler)
               for name, handler in (("dimension", wrong_dimension), ("vectors", wrong_vectors))}
    for server in servers.values():
        threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield {name: f"http://127.0.0.1:{s.server_address[1]}" for name, s in servers.items()}
    finally:
        for server in servers.values():
            server.shutdown()
            server.server_close()


def test_quick_suite_measures_embedserve_and_fails_broken_servers(tmp_path: Path, broken_servers,
                                                                   default_model_dir: Path):
    shared_file("eval/xquad/xquad.en.json")
    report = tmp_path / "BENCHMARKS.md"
    report.write_text("# Benchmarks\n")
    command = [sys.executable, "-m", "bench", "suite", "--quick", "--model", str(default_model_dir),
               "--report", str(report), "--plots-dir", str(tmp_path / "plots"),
               "--json", str(tmp_path / "run.json"), "--data-dir", str(SHARED_DATA),
               "--openai-url", broken_servers["dimension"], "--openai-url", broken_servers["vectors"]]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]

    record = json.loads((tmp_path / "run.json").read_text())
    ours = [s["name"] for s in record["systems"] if s["name"].startswith("embedserve")]
    assert ours == ["embedserve default"] and len(record["systems"]) == 3
    # No --dtype was passed: what the server chose is read back from its /info.
    default = record["systems"][0]
    assert default["configuration"] in ("cpu, float32", "cpu, bfloat16"), default
    assert f"no --dtype: {default['configuration'].split(', ')[1]}" in default["note"]
    for workload in WORKLOADS:
        rows = [r for r in record["rows"] if r["system"] == ours[0] and r["workload"] == workload]
        assert rows and all(r["failures"] == 0 and not r["skipped"] for r in rows), (workload, rows)
        assert all(r["texts"] > 0 and r["seconds"] > 0 for r in rows), workload
        if workload != "throughput":
            assert all(len(r["latencies_ms"]) >= 2 for r in rows), workload

    text = report.read_text()
    assert text.startswith("# Benchmarks\n") and "<!-- section: suite -->" in text
    tables = text.split("### ")[1:]
    assert len([t for t in tables if t[0] in "1234"]) == 4
    for table in (t for t in tables if t[0] in "1234"):
        ours_line = next(line for line in table.splitlines() if line.startswith(f"| {ours[0]} |"))
        cells = [c.strip() for c in ours_line.split("|")[3:-4]]
        assert cells and all(c[0].isdigit() for c in cells), ours_line
        assert ours_line.endswith("| ok |")

    for url in broken_servers.values():
        name = f"OpenAI-compatible {url}"
        rows = [r for r in record["rows"] if r["system"] == name]
        assert rows and all(r["failures"] > 0 for r in rows if not r["skipped"]), rows
        assert not any(r["latencies_ms"] or r["texts"] for r in rows), "a broken system got figures"
        lines = [line for line in text.splitlines() if line.startswith(f"| {name} |")]
        assert lines and all("FAILED" in line or "n/a" in line for line in lines)
    assert "dimension 383, expected 384" in text
    assert "cosine" in next(r["failure"] for r in record["rows"]
                            if r["system"].endswith(broken_servers["vectors"]) and r["failures"])

    plots = sorted((tmp_path / "plots").glob("*.png"))
    assert len(plots) == 4
    for plot in plots:
        assert plot.read_bytes()[:8] == PNG_MAGIC
        assert f"({Path('plots') / plot.name})" in text


@pytest.mark.parametrize("benchmark", [["suite", "--quick", "--data-dir"], ["tokenizer", "--data"]])
def test_missing_reference_data_is_one_line_and_exit_2(tmp_path: Path, benchmark: list[str]):
    # Run from an empty directory: nothing may be written there (no model copy, no cache).
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    command = [sys.executable, "-m", "bench", *benchmark, str(tmp_path / "no-data")]
    if benchmark[0] == "suite":
        command += ["--report", str(tmp_path / "BENCHMARKS.md")]
    done = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr
    assert done.stdout == "" and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert "Traceback" not in done.stderr
    assert f"python -m bench {benchmark[0]}: reference data not found: {tmp_path / 'no-data'}" in done.stderr
    assert list(cwd.iterdir()) == [] and not (tmp_path / "BENCHMARKS.md").exists()


def test_int8_systems_are_held_to_int8_bounds(tmp_path: Path):
    from bench.suite.systems import SuiteContext, build_system

    ctx = SuiteContext(tmp_path, tmp_path / "reranker", tmp_path, "cpu", {}, lambda line: None)
    ours, onnx, torch_int8, default = (build_system(key, ctx) for key in
                                       ("embedserve-int8", "infinity-onnx-int8", "infinity-int8", "embedserve"))
    assert (ours.min_cosine, ours.score_tolerance) == (0.99, 0.25) and ours.configuration == "cpu, int8"
    assert len(ours.phases) == 2                                        # embeddings, then the reranker
    assert (default.min_cosine, default.score_tolerance) == (0.999, 0.05)
    assert onnx.min_cosine == 0.99 and [p.workloads for p in onnx.phases] == [("latency", "throughput",
                                                                               "concurrency")]
    assert torch_int8.score_tolerance == 0.25 and "rerank" in torch_int8.phases[0].workloads
