"""The fault suite (tests/faults/suite.py) in CI: every fault, 0 wrong and 0 lost answers.

One run of the suite with short phases (a gateway and two replicas as real
processes, on network-namespace hosts when this machine allows it, else on
loopback ports), shared by the tests below; each test checks one property
of one phase. The link-cut fault needs namespaces and is skipped with the
reason when they are unavailable; nothing else is.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from tests.faults.netns import namespaces_available
from tests.faults.suite import PhaseResult, render_table, run_suite

PHASE_SECONDS = 2.0
PHASES = ("baseline", "kill -9", "restart", "hang", "link cut", "slow", "SIGTERM", "overload")


@pytest.fixture(scope="module")
def fault_run(default_model_dir: Path, probe_reference,
              tmp_path_factory: pytest.TempPathFactory) -> tuple[str, dict[str, PhaseResult]]:
    logs = tmp_path_factory.mktemp("fault-logs")
    mode, results = asyncio.run(run_suite(default_model_dir, logs, "auto", PHASE_SECONDS,
                                          expected=probe_reference))
    seconds = ", ".join(f"{r.name} {r.facts.get('seconds', 0):.0f}s" for r in results)
    print(f"\nfault suite ({mode} mode; {seconds}):\n{render_table(results)}")
    return mode, {r.name: r for r in results}


@pytest.mark.parametrize("phase", PHASES)
def test_no_answer_is_wrong_or_lost(fault_run: tuple[str, dict[str, PhaseResult]], phase: str) -> None:
    _, results = fault_run
    result = results[phase]
    if result.skipped:
        pytest.skip(result.skipped)
    o = result.outcomes
    assert o.wrong == 0, o.wrong_examples
    assert o.lost == 0
    assert o.answered == o.sent
    # The load kept flowing and was served through the fault.
    assert o.correct >= 5, (o.correct, o.sent)


def test_restarted_replica_is_taken_back_into_rotation(fault_run) -> None:  # noqa: ANN001
    _, results = fault_run
    assert "rejoin_s" in results["restart"].facts, results["restart"].notes


def test_sigterm_drains_and_exits_zero(fault_run) -> None:  # noqa: ANN001
    _, results = fault_run
    assert results["SIGTERM"].facts.get("exit_status") == 0, results["SIGTERM"].notes


def test_overload_is_answered_with_retryable_errors(fault_run) -> None:  # noqa: ANN001
    _, results = fault_run
    outcomes = results["overload"].outcomes
    # The burst was far past the gateway's budget: some of it must have been
    # turned away with 429 rather than queued, and the rest answered right.
    assert outcomes.retryable > 0
    assert outcomes.correct > 0


def test_namespace_mode_is_used_where_available(fault_run) -> None:  # noqa: ANN001
    mode, results = fault_run
    available, why = namespaces_available()
    if not available:
        pytest.skip(f"network namespaces unavailable here ({why}); the suite ran on loopback")
    assert mode == "netns"
    # There the gateway got `--upstream dns:replicas:PORT` and found both
    # replica hosts by resolving the name.
    assert results["baseline"].facts["replicas_known"] == 2, results["baseline"].notes
