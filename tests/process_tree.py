"""What a test sees of the processes it started: a parent's children, and whether one lives."""

from __future__ import annotations

from embedserve.process_children import living_children


def children(pid: int) -> list[int]:
    """Living direct children of ``pid`` (empty once it is gone)."""
    return sorted(living_children(pid))


def alive(pid: int) -> bool:
    """True while ``pid`` runs; a zombie (exited, not yet reaped) counts as gone."""
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().rsplit(") ", 1)[1][0] != "Z"
    except FileNotFoundError:
        return False
