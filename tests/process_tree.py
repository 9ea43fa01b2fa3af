"""What a test sees of the processes it started: a parent's children, and whether one lives."""

from __future__ import annotations

import os


def children(pid: int) -> list[int]:
    """Direct children of ``pid`` (empty once it is gone)."""
    found: list[int] = []
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except FileNotFoundError:
        return found
    for task in tasks:
        try:
            with open(f"/proc/{pid}/task/{task}/children") as handle:
                found += [int(p) for p in handle.read().split()]
        except FileNotFoundError:
            continue
    return found


def alive(pid: int) -> bool:
    """True while ``pid`` runs; a zombie (exited, not yet reaped) counts as gone."""
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().rsplit(") ", 1)[1][0] != "Z"
    except FileNotFoundError:
        return False
