"""Where each normalized byte came from, or nothing.

The normalizers keep, for every byte they write, the [start, end) bytes of the source
it came from (``out_origin`` in spec.py, int32 [N, 2]). Ids never depend on it except
through hf mode's "first" prepend scheme, which asks whether a word starts at source
byte 0; otherwise it only serves character offsets. ``encode()`` reports none, so it
passes ``None`` instead of the array, and every write and read below compiles to
nothing there: the normalizers' passes then write a byte per byte instead of a byte
and eight (hf mode's three passes: 10.6 -> 7.4 us a text, hot, on the multilingual
bench).

The functions are chosen by the type of ``origin`` while the calling kernel is typed
and inlined at the IR level (a real call taking an array costs reference counting, per
byte here).
"""

from __future__ import annotations

from numba.core import types
from numba.extending import overload


def set_origin(origin, i, start, end):
    """Byte i of the output came from source bytes [start, end). Kernels only."""
    raise NotImplementedError("set_origin is typed inside kernels only")


def origin_start(origin, i):
    """Where output byte i came from, first source byte (0 without origins). Kernels only."""
    raise NotImplementedError("origin_start is typed inside kernels only")


def origin_end(origin, i):
    """Where output byte i came from, end of its source range (0 without origins). Kernels only."""
    raise NotImplementedError("origin_end is typed inside kernels only")


def origin_rows(origin, default):
    """How many bytes ``origin`` has room for (``default`` without origins). Kernels only."""
    raise NotImplementedError("origin_rows is typed inside kernels only")


@overload(set_origin, inline="always")
def _set_origin_for(origin, i, start, end):
    if isinstance(origin, types.NoneType):  # type: ignore[attr-defined]  # numba's stubs lack it
        return lambda origin, i, start, end: None

    def write(origin, i, start, end):
        origin[i, 0] = start
        origin[i, 1] = end
    return write


@overload(origin_start, inline="always")
def _origin_start_for(origin, i):
    if isinstance(origin, types.NoneType):  # type: ignore[attr-defined]  # numba's stubs lack it
        return lambda origin, i: 0
    return lambda origin, i: origin[i, 0]


@overload(origin_end, inline="always")
def _origin_end_for(origin, i):
    if isinstance(origin, types.NoneType):  # type: ignore[attr-defined]  # numba's stubs lack it
        return lambda origin, i: 0
    return lambda origin, i: origin[i, 1]


@overload(origin_rows, inline="always")
def _origin_rows_for(origin, default):
    if isinstance(origin, types.NoneType):  # type: ignore[attr-defined]  # numba's stubs lack it
        return lambda origin, default: default
    return lambda origin, default: origin.shape[0]
