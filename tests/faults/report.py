"""What one fault-suite run found, and RELIABILITY.md written from it."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from embedserve.gateway.settings import GatewaySettings
from tests.faults.load import Outcomes

# The gateway finds a replica that stopped answering once a ping goes unanswered: a ping
# every --replica-ping seconds, each given as long; then a retry on the other replica.
PING_S = GatewaySettings.replica_ping_s
FOUND_WITHIN_MS = 2 * PING_S * 1e3 + 500


@dataclass
class PhaseResult:
    name: str
    fault: str
    outcomes: Outcomes = field(default_factory=Outcomes)
    notes: list[str] = field(default_factory=list)
    skipped: str = ""  # why the phase did not run, if it did not
    facts: dict[str, float] = field(default_factory=dict)  # checked by the CI test


def render_table(results: list[PhaseResult]) -> str:
    rows = ["| phase | fault | sent | correct | retryable (429/503) | wrong | lost | p99 ms | max ms | notes |",
            "|---|---|---:|---:|---:|---:|---:|---:|---:|---|"]
    for r in results:
        o = r.outcomes
        if r.skipped:
            rows.append(f"| {r.name} | {r.fault} | – | – | – | – | – | – | – | skipped: {r.skipped} |")
            continue
        rows.append(f"| {r.name} | {r.fault} | {o.sent} | {o.correct} | {o.retryable} | {o.wrong} | "
                    f"{o.lost} | {o.p99_ms():.0f} | {o.max_ms():.0f} | {'; '.join(r.notes)} |")
    return "\n".join(rows)


_MODES = {
    "netns": "each process on its own network-namespace host, joined by veth links; the gateway "
             "finds the replicas by resolving one name (`--upstream dns:replicas:50051`)",
    "loopback": "loopback ports; the link-cut fault needs namespaces and was skipped",
}

_REPORT = """# Reliability

What the serving stack does when parts of it fail under load: one gateway and
two scheduler+engine replicas as separate processes ({mode} mode: {mode_note}),
steady embedding traffic from 4 clients whose right answers are known in
advance (sentence-transformers on the same model), one fault per phase.

Reproduce (2-core CPU machine, default model, a few minutes; namespace mode
needs root and iproute2, else it runs on loopback):

```bash
{command}
```

Measured {when}; 1-minute load average when it started: {load:.1f} (other
jobs sharing the 2 cores inflate every latency here).

{table}

- **sent**: requests sent during the phase (each with 1 to 3 probe texts in a
  random order, or 32 in the overload burst); a request is counted in the
  phase it was sent in, and a phase ends only once all its requests ended.
- **correct**: 200 and every vector matches its own text (cosine >= 0.999
  with the reference; any two probe texts are far below that), in order.
- **retryable**: 429 or 503, which clients retry (429 carries Retry-After).
- **wrong**: any other answer: a wrong or misplaced vector, or another status.
  Must be 0.
- **lost**: no HTTP answer at all (reset connection, client timeout of 60 s).
  Must be 0.
- **p99**, **max**: latency over the answered requests of the phase, in
  milliseconds. Only the few requests in flight on a replica when it hangs
  wait for it (4 clients), so in the hang and link-cut phases p99 can hide
  them; max shows them.

## Reading it

{observations}

The CI test `tests/test_deploy_faults.py` runs the same phases, shorter, and
asserts 0 wrong and 0 lost in every phase, that the restarted replica serves
again, that SIGTERM exits 0 after draining, and that the overload burst was
answered with 429s rather than queued. The phases run in the order of the
table on one cluster: after SIGTERM, replica 0 stays down, so the overload
phase runs on one replica.
"""


def _observations(results: list[PhaseResult]) -> str:
    by_name = {r.name: r for r in results if not r.skipped}
    lines = []
    for name in ("hang", "link cut"):
        phase = by_name.get(name)
        if phase is None or "fault_s" not in phase.facts:
            continue
        fault_ms, slowest = phase.facts["fault_s"] * 1e3, phase.outcomes.max_ms()
        if slowest > min(FOUND_WITHIN_MS, 0.95 * fault_ms):
            lines.append(
                f"- {name}: nothing is lost, but the slowest request took {slowest:.0f} ms, about the "
                f"length of the fault ({fault_ms:.0f} ms): calls the gateway had already sent to that "
                "replica wait until it answers again. Neither fault closes the connection, so the "
                "gateway's health watch does not notice it in time; only the request deadline bounds "
                "the wait (no per-call timeout or hedged retry on the other replica). New calls avoid "
                "the replica, whose outstanding tokens stay high (least-outstanding-tokens balancing).")
        else:
            lines.append(
                f"- {name}: nothing is lost; the slowest request took {slowest:.0f} ms while the fault "
                f"lasted {fault_ms:.0f} ms: within twice `--replica-ping` ({PING_S:g} s) a ping of the "
                "gateway's to that replica went unanswered, so it dropped the replica's connections "
                "(gRPC's and the frames'), its calls failed as UNAVAILABLE and were retried on the other "
                "replica, and the replica left rotation until it answered again.")
    restart = by_name.get("restart")
    if restart is not None and "rejoin_s" in restart.facts:
        facts = restart.facts
        lines.append(f"- restart: the restarted replica reported SERVING {facts['serving_s']:.1f} s after "
                     f"its start (torch import, model load, warm-up step) and was answering the "
                     f"gateway's calls {facts['rejoin_s']:.1f} s after its start (the gateway's health "
                     "watch retries a lost replica with a backoff of at most 2 s).")
    overload = by_name.get("overload")
    if overload is not None:
        o = overload.outcomes
        lines.append(f"- overload: {o.retryable} of {o.sent} requests were turned away at once with 429 + "
                     f"Retry-After instead of queueing; the {o.correct} admitted were answered correctly.")
    return "\n".join(lines) or "- Every phase answered like the baseline."


def render_report(mode: str, command: str, results: list[PhaseResult], load_average: float) -> str:
    return _REPORT.format(mode=mode, mode_note=_MODES[mode], command=command, load=load_average,
                          when=time.strftime("%Y-%m-%d", time.gmtime()), table=render_table(results),
                          observations=_observations(results))
