"""The bulk command's progress bar and its one-line summary.

A ``rich`` bar on stderr: documents done (of the total when the input says
it cheaply), tokens per second, time left. The summary line is what a log
keeps: documents, tokens, seconds, tokens/s and the skipped rows by reason.
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn


@dataclass
class Totals:
    documents: int = 0
    tokens: int = 0
    resumed_rows: int = 0
    skipped: Counter = field(default_factory=Counter)
    started: float = field(default_factory=time.monotonic)

    @property
    def seconds(self) -> float:
        return time.monotonic() - self.started

    def summary(self) -> str:
        seconds = self.seconds
        rate = self.tokens / seconds if seconds > 0 else 0.0
        skipped = sum(self.skipped.values())
        reasons = ", ".join(f"{n} {reason}" for reason, n in sorted(self.skipped.items()))
        resumed = f"; {self.resumed_rows} rows were already done" if self.resumed_rows else ""
        return (f"embedded {self.documents} documents, {self.tokens} tokens in {seconds:.1f} s "
                f"({rate:,.0f} tokens/s); skipped {skipped}" + (f" ({reasons})" if reasons else "")
                + resumed)


class ProgressBar:
    """Rows done, tokens/s and ETA; silent when ``enabled`` is False."""

    def __init__(self, total_rows: int | None, enabled: bool = True) -> None:
        self._progress = Progress(TextColumn("embedding"), BarColumn(), MofNCompleteColumn(),
                                  TextColumn("{task.fields[rate]} tokens/s"), TimeElapsedColumn(),
                                  TimeRemainingColumn(), console=Console(stderr=True),
                                  disable=not enabled, transient=False)
        self._task = self._progress.add_task("embed", total=total_rows, rate="-")
        self._started = time.monotonic()
        self._tokens = 0

    def __enter__(self) -> ProgressBar:
        self._progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._progress.stop()

    def advance(self, rows: int, tokens: int = 0) -> None:
        self._tokens += tokens
        elapsed = max(time.monotonic() - self._started, 1e-9)
        self._progress.update(self._task, advance=rows, rate=f"{self._tokens / elapsed:,.0f}")
