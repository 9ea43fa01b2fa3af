"""bench priority_toggle's arithmetic: each on segment against its two off neighbours."""

from __future__ import annotations

import pytest
from prometheus_client import generate_latest

from bench.priority_toggle import BATCH_TOKENS, on_off_ratios
from embedserve.gateway.replica_metrics import merge
from embedserve.scheduler.metrics import SchedulerMetrics


def test_each_on_segment_is_compared_with_the_mean_of_its_off_neighbours() -> None:
    segments = [(False, 100.0, 1.0), (True, 88.0, 1.0), (False, 120.0, 1.0), (True, 55.0, 0.5),
                (False, 100.0, 1.0), (True, 10.0, 1.0)]            # the last on segment: no right neighbour
    assert on_off_ratios(segments) == pytest.approx([88 / 110, 110 / 110])


def test_segments_that_do_not_alternate_give_no_ratio() -> None:
    assert on_off_ratios([(True, 1.0, 1.0), (False, 1.0, 1.0)]) == []
    assert on_off_ratios([(False, 1.0, 1.0), (True, 1.0, 1.0), (True, 1.0, 1.0), (False, 1.0, 1.0)]) == []


def test_the_batch_tokens_of_every_replica_are_read_from_the_gateways_metrics() -> None:
    # What two replicas write, merged as the gateway serves them (a replica label each).
    texts = []
    for name, batch in (("r0", 1200), ("r1", 3500)):
        metrics = SchedulerMetrics()
        metrics.class_step_tokens.labels("batch").observe(batch)
        metrics.class_step_tokens.labels("interactive").observe(7)
        texts.append((name, generate_latest(metrics.registry).decode()))
    assert sorted(float(v) for v in BATCH_TOKENS.findall(merge(texts).decode())) == [1200.0, 3500.0]
