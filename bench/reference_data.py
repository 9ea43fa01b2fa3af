"""Where the benchmarks' reference data lives, and one clear line when it does not.

The texts the benchmarks cut come from the reference data (``../shared/data``
next to the checkout by default, ``--data-dir`` / ``--data`` to change it),
which a plain clone does not have. Each benchmark checks its files before
building or starting anything and, if one is missing, prints a single line
naming it and exits with status 2 instead of a traceback.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path

import numpy as np

DEFAULT_DATA_DIR = Path(__file__).resolve().parents[1].parent / "shared" / "data"
MISSING_EXIT_STATUS = 2


def missing_line(command: str, paths: Iterable[Path], flag: str | None = None) -> str | None:
    """None when every path exists; else one line naming the first missing file and the fix."""
    absent = [path for path in paths if not path.exists()]
    if not absent:
        return None
    more = f" (and {len(absent) - 1} more)" if len(absent) > 1 else ""
    fix = f"pass {flag} DIR (default {DEFAULT_DATA_DIR})" if flag else f"it is read from {DEFAULT_DATA_DIR}"
    return f"{command}: reference data not found: {absent[0]}{more}; {fix}"


def read_xquad(path: Path) -> tuple[list[str], list[str], np.ndarray]:
    """Passages, questions, and the index of the passage each question was asked about."""
    passages, questions, relevant = [], [], []
    for article in json.loads(path.read_text())["data"]:
        for paragraph in article["paragraphs"]:
            passages.append(paragraph["context"])
            for qa in paragraph["qas"]:
                questions.append(qa["question"])
                relevant.append(len(passages) - 1)
    return passages, questions, np.array(relevant)
