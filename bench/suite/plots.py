"""PNG plots of a suite run: latency percentiles by size, throughput, and latency/throughput by concurrency.

Owns drawing (matplotlib, Agg backend, no display) from a ``RunRecord``;
only rows that passed their checks are drawn. Returns the files written so
the report can link them. Knows nothing about how the figures were measured.
"""

from __future__ import annotations

from pathlib import Path

from bench.suite.results import Row, RunRecord


def _ok(record: RunRecord, workload: str) -> dict[str, list[Row]]:
    by_system: dict[str, list[Row]] = {}
    for row in record.rows:
        if row.workload == workload and row.status == "ok":
            by_system.setdefault(row.system, []).append(row)
    return {name: sorted(rows, key=lambda r: r.x) for name, rows in by_system.items()}


def _percentile_lines(ax, rows_by_system: dict[str, list[Row]], xlabel: str, title: str) -> None:
    for i, (name, rows) in enumerate(rows_by_system.items()):
        color = f"C{i}"
        xs = [r.x for r in rows]
        ax.plot(xs, [r.percentile(50) for r in rows], "o-", color=color, label=f"{name} p50")
        ax.plot(xs, [r.percentile(99) for r in rows], "s--", color=color, alpha=0.7, label=f"{name} p99")
    ax.set_xlabel(xlabel)
    ax.set_ylabel("ms")
    ax.set_yscale("log")
    ax.set_title(title)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7)


def write_plots(record: RunRecord, out_dir: Path, prefix: str = "suite") -> dict[str, Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir.mkdir(parents=True, exist_ok=True)
    written: dict[str, Path] = {}

    for workload, xlabel, title in (("latency", "input tokens", "batch-1 embedding latency"),
                                    ("rerank", "documents (pairs of equal length)", "rerank latency")):
        rows = _ok(record, workload)
        if rows:
            fig, ax = plt.subplots(figsize=(7, 4.5))
            _percentile_lines(ax, rows, xlabel, f"{title}: p50 and p99 by size")
            path = out_dir / f"{prefix}_{workload}.png"
            fig.tight_layout()
            fig.savefig(path, dpi=110)
            plt.close(fig)
            written[title] = path

    rows = _ok(record, "throughput")
    if rows:
        labels = list(dict.fromkeys(r.label for rs in rows.values() for r in rs))
        fig, ax = plt.subplots(figsize=(7, 4.5))
        width = 0.8 / len(rows)
        for i, (name, system_rows) in enumerate(rows.items()):
            values = {r.label: r.tokens_per_s for r in system_rows}
            ax.bar([j + i * width for j in range(len(labels))], [values.get(label, 0) for label in labels],
                   width, label=name, color=f"C{i}")
        ax.set_xticks([j + width * (len(rows) - 1) / 2 for j in range(len(labels))], labels)
        ax.set_ylabel("tokens/s")
        ax.set_title("batched throughput (concurrent client processes)")
        ax.grid(True, axis="y", alpha=0.3)
        ax.legend(fontsize=7)
        fig.tight_layout()
        path = out_dir / f"{prefix}_throughput.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        written["throughput"] = path

    rows = _ok(record, "concurrency")
    if rows:
        fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.5))
        _percentile_lines(left, rows, "concurrent clients", "batch-1 latency by concurrency")
        for i, (name, system_rows) in enumerate(rows.items()):
            right.plot([r.x for r in system_rows], [r.texts_per_s for r in system_rows], "o-",
                       color=f"C{i}", label=name)
        right.set_xlabel("concurrent clients")
        right.set_ylabel("embeddings/s")
        right.set_title("throughput by concurrency")
        right.grid(True, alpha=0.3)
        right.legend(fontsize=7)
        levels = sorted({r.x for rs in rows.values() for r in rs})
        for ax in (left, right):
            ax.set_xscale("log", base=2)
            ax.set_xticks(levels, [str(x) for x in levels])
        fig.tight_layout()
        path = out_dir / f"{prefix}_concurrency.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        written["concurrency"] = path
    return written
