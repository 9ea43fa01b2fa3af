"""What a suite run measured: one ``Row`` per (system, workload, size), and per-system outcomes.

Owns the figures' shapes, their percentiles, and saving/loading a run as JSON
(so a report can be rewritten, or GPU and CPU runs compared, without
re-measuring). A row whose answers failed a check is FAILED and shows no
figures: a broken system must not look fast.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

WORKLOADS = ("latency", "rerank", "throughput", "concurrency")
# The system that runs `embedserve serve` as a user would, with no --dtype: the
# report's baseline, compared row by row with the best peer.
DEFAULT_SYSTEM = "embedserve default"


@dataclass
class Row:
    system: str
    workload: str                 # one of WORKLOADS
    label: str                    # "128 tokens", "25 docs", "mixed 16-512", "8 clients"
    x: int                        # the size as a number, for plots and ordering
    latencies_ms: list[float] = field(default_factory=list)
    texts: int = 0                # embeddings (or scored pairs) answered and checked
    tokens: int = 0
    seconds: float = 0.0          # wall time of the timed part
    failures: int = 0
    failure: str = ""             # the first failed check, verbatim
    skipped: str = ""             # why the row was not measured
    worst_agreement: float | None = None   # smallest cosine (embeddings) / largest score error

    @property
    def status(self) -> str:
        if self.failures:
            return "FAILED"
        return "n/a" if self.skipped else "ok"

    def percentile(self, q: float) -> float:
        return float(np.percentile(self.latencies_ms, q)) if self.latencies_ms else float("nan")

    def latency_figures(self) -> dict[str, float]:
        return {"p50": self.percentile(50), "p90": self.percentile(90), "p99": self.percentile(99),
                "max": max(self.latencies_ms, default=float("nan"))}

    @property
    def texts_per_s(self) -> float:
        return self.texts / self.seconds if self.seconds else float("nan")

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds if self.seconds else float("nan")

    def fail(self, reason: str) -> None:
        self.failures += 1
        if not self.failure:
            self.failure = reason

    def agree(self, value: float, larger_is_better: bool) -> None:
        if self.worst_agreement is None:
            self.worst_agreement = value
        else:
            self.worst_agreement = (min if larger_is_better else max)(self.worst_agreement, value)


@dataclass
class SystemOutcome:
    name: str
    note: str = ""
    unavailable: str = ""         # could not be installed or started; the run went on
    skipped: str = ""             # not measured on purpose (e.g. the same configuration as another system)
    configuration: str = ""       # embedserve's device and dtype (and CUDA graphs), as served
    probe_cosine: float | None = None
    min_cosine_bound: float = 0.0


@dataclass
class RunRecord:
    command: str
    started_utc: str
    machine: dict[str, str]
    profile: str
    scheme: str
    systems: list[SystemOutcome] = field(default_factory=list)
    rows: list[Row] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    finished_utc: str = ""
    wall_s: float = 0.0

    def save(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(asdict(self), indent=1))

    @classmethod
    def load(cls, path: Path) -> RunRecord:
        raw = json.loads(path.read_text())
        systems = [SystemOutcome(**s) for s in raw.pop("systems")]
        rows = [Row(**r) for r in raw.pop("rows")]
        return cls(**raw, systems=systems, rows=rows)
