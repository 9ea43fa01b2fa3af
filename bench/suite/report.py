"""The suite's report: markdown tables per workload, written into one section of BENCHMARKS.md.

Owns turning a ``RunRecord`` into markdown (machine, command, date, the input
scheme and checks, a systems table, one table per workload with each
figure's ratio to the baseline embedserve system, and the baseline against
the best peer per row with the issue's targets, from ``best_peer``) and replacing the
``<!-- section: NAME -->`` ... ``<!-- end: NAME -->`` block of the report file (appended when missing). Text between
``<!-- notes -->`` and ``<!-- end notes -->`` inside the old block is kept,
so hand-written analysis survives a re-run. Plots are ``plots``' job.
"""

from __future__ import annotations

import math
import re
from pathlib import Path

from bench.suite.best_peer import CPU_TARGETS, HEADLINE, comparisons, target_for, verdict
from bench.suite.results import Row, RunRecord

TITLES = {
    "latency": "1. Low-latency embeddings (batch 1, sequential requests), ms",
    "rerank": "2. Low-latency scoring (one query, N documents, sequential requests), ms",
    "throughput": "3. High-throughput embeddings (concurrent client processes, batched requests)",
    "concurrency": "4. High-concurrency embeddings (batch 1, N concurrent clients), ms",
}
LATENCY_FIGURES = ("p50", "p90", "p99", "max")


def _number(value: float) -> str:
    if math.isnan(value):
        return "—"
    return f"{value:,.0f}" if value >= 100 else f"{value:.1f}" if value >= 10 else f"{value:.2f}"


def _ratio(value: float, base: float | None) -> str:
    if base is None or math.isnan(value) or not base or math.isnan(base):
        return ""
    return f" ({value / base:.2f}×)"


def _status(row: Row) -> str:
    if row.failures:
        return f"**FAILED** ({row.failures}×: {row.failure[:160]})"
    return f"n/a: {row.skipped}" if row.skipped else "ok"


def _agreement(row: Row) -> str:
    if row.worst_agreement is None:
        return "—"
    return f"{row.worst_agreement:.5f}" if row.workload != "rerank" else f"{row.worst_agreement:.4f}"


def _figures(row: Row) -> dict[str, float]:
    if row.workload == "throughput":
        return {"emb/s": row.texts_per_s, "tokens/s": row.tokens_per_s}
    figures = row.latency_figures()
    if row.workload == "concurrency":
        figures["emb/s"] = row.texts_per_s
    return figures


def workload_table(record: RunRecord, workload: str, baseline: str) -> list[str]:
    rows = [r for r in record.rows if r.workload == workload]
    if not rows:
        return []
    base = {r.label: _figures(r) for r in rows if r.system == baseline and r.status == "ok"}
    names = list(_figures(rows[0]))
    agree = "largest score error" if workload == "rerank" else "min cosine"
    lines = [f"### {TITLES[workload]}", "",
             "| system | size | " + " | ".join(names) + f" | n | {agree} | status |",
             "|---|---|" + "---:|" * len(names) + "---:|---:|---|"]
    for label in dict.fromkeys(r.label for r in sorted(rows, key=lambda r: r.x)):
        for row in (r for r in rows if r.label == label):
            figures = _figures(row)
            if row.status == "ok":
                ratios = {} if row.system == baseline else base.get(label, {})
                cells = [_number(v) + _ratio(v, ratios.get(k)) for k, v in figures.items()]
            else:
                cells = ["—"] * len(figures)
            n = len(row.latencies_ms) if workload != "throughput" else row.texts
            lines.append(f"| {row.system} | {label} | " + " | ".join(cells) +
                         f" | {n} | {_agreement(row)} | {_status(row)} |")
    return lines + [""]


def _overloaded(record: RunRecord) -> bool:
    try:
        return float(record.machine["load_before"]) > float(record.machine["cores"])
    except (KeyError, ValueError):
        return False


def best_peer_table(record: RunRecord, baseline: str) -> list[str]:
    """Every row of ``baseline`` ÷ the best peer on that row, with the CPU targets where they apply."""
    rows = comparisons(record, baseline)
    if not any(c.peer for c in rows):
        return []
    targets = CPU_TARGETS if record.profile == "cpu" else ()
    caveat = [f"**Caveat:** load average {record.machine['load_before']} on {record.machine['cores']} "
              "cores when this run started: other work shared the CPU, so 'met' describes this run only, "
              "not the systems on a quiet machine.", ""] if targets and _overloaded(record) else []
    lines = [f"### {baseline} against the best peer configuration, row by row", "",
             f"Each row: {baseline}'s figure ÷ the best figure any other system reached on the same "
             "row in this run, among measurements that passed their checks (lowest latency, highest "
             "tokens/s); the best peer may differ from row to row."
             + (" Targets: issue 16 (CPU, default settings)." if targets else ""), "", *caveat,
             "| workload | size | figure | " + baseline + " | best peer | its figure | ratio | target | met |",
             "|---|---|---|---:|---|---:|---:|---:|---|"]
    for c in rows:
        target = target_for(c, targets)
        sign = "≤" if c.lower_is_better else "≥"
        goal = f"{sign} {target.ratio}×" if target else ""
        outcome = verdict(c, target) if target else None
        met = "" if outcome is None else \
            f"yes ({outcome[1]:.0%} to spare)" if outcome[0] else f"**no** (missed by {outcome[1]:.0%})"
        if target and outcome is None:
            met = "no peer measured"
        ratio = "—" if math.isnan(c.ratio) else f"{c.ratio:.2f}×"
        lines.append(f"| {c.workload} | {c.label} | {c.figure} | {_number(c.ours)} | {c.peer or '—'} | "
                     f"{_number(c.theirs)} | {ratio} | {goal} | {met} |")
    missing = [t for t in targets if not any(target_for(c, (t,)) for c in rows)]
    lines += [f"| {t.workload} | {t.label} | {HEADLINE[t.workload][0]} | — | — | — | — | "
              f"{'≤' if HEADLINE[t.workload][1] else '≥'} {t.ratio}× | not measured |" for t in missing]
    return lines + [""]


def systems_table(record: RunRecord) -> list[str]:
    lines = ["| system | status | probe cosine | min cosine, all answers | bound | note |",
             "|---|---|---:|---:|---:|---|"]
    for s in record.systems:
        rows = [r for r in record.rows if r.system == s.name]
        failed = [r for r in rows if r.failures]
        cosines = [r.worst_agreement for r in rows if r.workload != "rerank" and r.worst_agreement is not None]
        status = f"unavailable: {s.unavailable[:300]}" if s.unavailable else \
            f"skipped: {s.skipped}" if s.skipped else \
            f"**FAILED** ({len(failed)} measurements)" if failed else "ok"
        probe = "—" if s.probe_cosine is None else f"{s.probe_cosine:.5f}"
        low = f"{min(cosines):.5f}" if cosines else "—"
        note = s.note.replace("\n", " ").replace("|", "/")
        lines.append(f"| {s.name} | {status.replace(chr(10), ' ').replace('|', '/')} | {probe} | {low} | "
                     f"{s.min_cosine_bound} | {note} |")
    return lines + [""]


def render(record: RunRecord, baseline: str, plots: dict[str, str], title: str) -> str:
    m = record.machine
    out = [f"## {title}", "", "Command:", "", "```bash", record.command, "```", "",
           f"Run {record.started_utc} → {record.finished_utc} ({record.wall_s / 60:.1f} min), "
           f"profile `{record.profile}`.", "",
           f"Machine: {m.get('cpu', '?')}, {m.get('cores', '?')} cores, {m.get('ram', '?')} RAM, "
           f"{m.get('accelerator', 'no GPU')}; torch {m.get('torch', '?')}; "
           f"load average {m.get('load_before', '?')} before, {m.get('load_after', '?')} after.", "",
           record.scheme, "", "Systems (started one at a time; never two servers at once):", ""]
    out += systems_table(record)
    ratios = (f"Ratios in parentheses are each figure ÷ the same figure of **{baseline}** in this run "
              "(latency: below 1 is faster; throughput: above 1 is faster). ") if baseline else \
        "No embedserve system in this run, so no ratios. "
    out += [ratios + "A measurement whose answers failed a check shows no figures.", ""]
    for workload in TITLES:
        out += workload_table(record, workload, baseline)
    if baseline:
        out += best_peer_table(record, baseline)
    for name, path in plots.items():
        out += [f"![{name}]({path})", ""]
    out += [f"- {note}" for note in record.notes]
    return "\n".join(out).rstrip() + "\n"


def write_section(report: Path, section: str, body: str) -> None:
    """Replace the inside of ``section`` in ``report`` (appended if missing), keeping its notes block."""
    begin, end = f"<!-- section: {section} -->", f"<!-- end: {section} -->"
    text = report.read_text(encoding="utf-8") if report.exists() else ""
    match = re.search(re.escape(begin) + r"(.*?)" + re.escape(end), text, flags=re.S)
    notes = ""
    if match:
        kept = re.search(r"<!-- notes -->.*?<!-- end notes -->", match.group(1), flags=re.S)
        notes = "\n" + kept.group(0) + "\n" if kept else ""
    block = f"{begin}\n{body}{notes}{end}"
    if match:
        text = text[:match.start()] + block + text[match.end():]
    else:
        text = text.rstrip("\n") + ("\n\n" if text else "") + block + "\n"
    report.write_text(text, encoding="utf-8")
