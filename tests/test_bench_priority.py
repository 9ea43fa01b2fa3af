"""bench/priority_bench.py's reading of what the gateway writes (the run itself is a benchmark)."""

from __future__ import annotations

import pytest

from bench.priority_bench import INFLIGHT, percentiles, server_timing
from embedserve.gateway.metrics import GatewayMetrics
from embedserve.gateway.middleware import server_timing as write_server_timing


def test_server_timing_reads_back_what_the_gateway_writes() -> None:
    phases = {"tokenize": 0.0012, "rpc": 0.0203, "total": 0.0251}
    assert server_timing(write_server_timing(phases)) == pytest.approx(phases)
    assert server_timing("") == {}


def test_the_bulk_window_reads_the_gateways_inflight_gauge() -> None:
    metrics = GatewayMetrics()
    metrics.inflight_tokens.labels("a").set(300)
    metrics.inflight_tokens.labels("b").set(12)
    assert sorted(float(v) for v in INFLIGHT.findall(metrics.render().decode())) == [12.0, 300.0]


def test_percentiles_and_phase_medians() -> None:
    results = [(0.0, k / 1000, {"rpc": k / 2000}) for k in range(1, 101)]
    row = percentiles(results)
    assert row["n"] == 100 and row["p50"] == pytest.approx(50.5) and row["max"] == pytest.approx(100.0)
    assert row["rpc"] == pytest.approx(25.25)


def test_steal_seconds_reads_the_cpu_lines_steal_column(tmp_path) -> None:
    """/proc/stat's first line: user nice system idle iowait irq softirq steal ..., in clock ticks."""
    import os

    from bench.priority_bench import steal_seconds

    stat = tmp_path / "stat"
    stat.write_text("cpu  100 0 50 900 3 0 2 250 0 0\ncpu0 50 0 25 450 1 0 1 125 0 0\n")
    assert steal_seconds(stat) == 250 / os.sysconf("SC_CLK_TCK")
    stat.write_text("cpu  100 0 50 900\n")   # an old kernel without the column
    assert steal_seconds(stat) == 0.0
    assert steal_seconds(tmp_path / "missing") == 0.0


def test_both_priority_benches_stop_at_missing_reference_data_with_one_line(tmp_path, capsys) -> None:
    from bench import priority_bench, priority_toggle
    from bench.reference_data import MISSING_EXIT_STATUS

    for bench, name in ((priority_bench, "priority"), (priority_toggle, "priority_toggle")):
        assert bench.main(["--data-dir", str(tmp_path)]) == MISSING_EXIT_STATUS
        error = capsys.readouterr().err
        assert error.startswith(f"python -m bench {name}: reference data not found") and error.count("\n") == 1
