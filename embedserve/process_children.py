"""A process's living children, read from Linux's /proc.

Each ``/proc/PID/stat`` names its parent, so a scan of them finds every child on any
Linux kernel. ``/proc/PID/task/TID/children`` would list them directly, but it exists
only on kernels built with CONFIG_PROC_CHILDREN and lists each thread's children apart;
a child the project's CI started did not appear in it (stop 55). Zombies (exited, not
yet reaped) are left out: to a caller they are gone.
"""

from __future__ import annotations

import os


def living_children(parent: int) -> set[int]:
    """The pids of ``parent``'s children that have not exited (none where /proc is absent)."""
    me = str(parent).encode()
    children: set[int] = set()
    try:
        entries = os.scandir("/proc")
    except OSError:
        return children
    with entries:
        for entry in entries:
            if not entry.name.isdigit():
                continue
            try:
                with open(f"/proc/{entry.name}/stat", "rb") as stat:
                    # "pid (comm) state ppid ...": comm may hold spaces and parentheses.
                    fields = stat.read().rsplit(b")", 1)[1].split()
            except (OSError, IndexError):
                continue     # it exited meanwhile
            if fields[1] == me and fields[0] != b"Z":
                children.add(int(entry.name))
    return children
