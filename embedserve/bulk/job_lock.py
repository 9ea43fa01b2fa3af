"""One ``embedserve embed`` run per output at a time: a lock file beside the output.

Two runs writing one output would interleave their part files and manifest
(seen: one run's ``part-000000.parquet.tmp`` renamed away under the other).
The lock is ``fcntl.flock`` on ``OUTPUT.lock``: the kernel releases it when
its holder exits, however it exits, so a crashed run leaves no stale lock.
The file holds the holder's pid, host and start time, which the refused run
names. The holder removes the file when done, still holding the lock; a run
that locked a file removed meanwhile tries again on the new one.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import socket
import time
from collections.abc import Iterator
from pathlib import Path

from embedserve.errors import InvalidInput


@contextlib.contextmanager
def output_lock(path: Path) -> Iterator[None]:
    """Hold the lock at ``path`` for the block; ``InvalidInput`` naming the holder if another
    run has it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _read(fd) or "another run"
            os.close(fd)
            output = path.with_name(path.name.removesuffix(".lock"))
            raise InvalidInput(f"{output} is being written by another embedserve embed run "
                               f"({holder}); wait for it to finish, or write elsewhere with -o",
                               field="output") from None
        if _same_file(fd, path):
            break
        os.close(fd)   # the holder removed it between our open and our lock: take the new one
    try:
        os.ftruncate(fd, 0)
        os.write(fd, (f"pid {os.getpid()} on {socket.gethostname()}, started "
                      f"{time.strftime('%Y-%m-%d %H:%M:%S')}").encode())
        yield
    finally:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
        os.close(fd)   # releases the lock


def _read(fd: int) -> str:
    os.lseek(fd, 0, os.SEEK_SET)
    return os.read(fd, 512).decode(errors="replace").strip()


def _same_file(fd: int, path: Path) -> bool:
    try:
        return os.fstat(fd).st_ino == os.stat(path).st_ino
    except FileNotFoundError:
        return False
