"""What the process's C heap does with memory a step frees: keep it, or hand it back.

Owns the two calls the engine makes into glibc's malloc:

- ``keep_freed_blocks``: a CPU engine's steps allocate and free the same large blocks
  over and over (a linear's output at 16k tokens is 20-60 MB). By default glibc serves
  every block over its mmap threshold (at most 32 MB) with a fresh ``mmap`` and unmaps
  it on free, and returns a freed heap top over its trim threshold to the OS, so each
  step touched its activations' pages anew: ~190,000 page faults a 32 x 512 step of
  multilingual-e5-small, 21 % of the step's time on one thread (1,964 against 1,547 ms;
  a oneDNN bf16 linear of 16,384 x 384 -> 1,152 took 29.7 ms against 12.0 ms; Xeon with
  AMX, BENCHMARKS.md). Kept, the heap stays at the largest step's working set, which the
  batcher's token budget bounds, and later steps reuse its pages: after 32 x 512 steps a
  bf16 process held 851-898 MB against 657-659 with glibc's default, after 8 x 512 steps
  649-653 against 608-631 (peak RSS the same). It settles after a few steps: torch's
  posix_memalign asks for a little more than a block, so a freed block serves the next
  one only once freed neighbours have joined it.
- ``return_freed_heap``: once, after loading, the load's temporary allocations (a
  probe's tokenizer, the float32 copy) go back to the OS explicitly.

A user's own malloc settings win: with any ``MALLOC_*_`` tunable or ``glibc.malloc``
in ``GLIBC_TUNABLES`` in the environment, ``keep_freed_blocks`` changes nothing. Both
are no-ops where the C library is not glibc (musl, macOS).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import os
import platform
from collections.abc import Mapping

# mallopt's parameters (glibc malloc.h)
M_TRIM_THRESHOLD = -1
M_MMAP_MAX = -4
# glibc's environment tunables for the same settings
MALLOC_ENVIRONMENT = ("MALLOC_MMAP_MAX_", "MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_TOP_PAD_")
INT_MAX = 2**31 - 1


@functools.cache
def _glibc() -> ctypes.CDLL | None:
    """The process's glibc, opened once; None where the C library is another."""
    if platform.libc_ver()[0] != "glibc":
        return None
    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    except OSError:
        return None


def user_tuned(environment: Mapping[str, str]) -> bool:
    """Whether ``environment`` sets any of glibc malloc's tunables."""
    return (any(name in environment for name in MALLOC_ENVIRONMENT)
            or "glibc.malloc." in environment.get("GLIBC_TUNABLES", ""))


def keep_freed_blocks() -> bool:
    """Tell glibc to serve large blocks from the heap and never trim it, so freed step
    memory is reused instead of unmapped and faulted in again. True if set; False where
    the C library is not glibc or the environment tunes malloc itself."""
    libc = _glibc()
    if libc is None or user_tuned(os.environ):
        return False
    return bool(libc.mallopt(M_MMAP_MAX, 0)) and bool(libc.mallopt(M_TRIM_THRESHOLD, INT_MAX))


def return_freed_heap() -> None:
    """Give the heap's free memory back to the OS now (glibc keeps it otherwise).

    Measured on the default model: loading tokenizer.json for the dtype probe's ids
    takes ~270 MB of small allocations that stay in the process after they are freed,
    so a probed replica held ~230 MB more than one started with an explicit dtype;
    trimmed, ~35 MB.
    """
    libc = _glibc()
    if libc is not None:
        libc.malloc_trim(0)
