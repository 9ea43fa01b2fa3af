"""Eight bytes at a time: unaligned 64-bit loads and stores on uint8 arrays, and a test
of all eight bytes of a word at once ("SIMD within a register").

The normalizers' copy loops spend most of Latin-script text on runs of printable ASCII
that they copy as they are; testing and copying those a word at a time instead of a
byte at a time (a load, four comparisons and a table read per byte) is what
``outside_printable`` and ``leading_run`` are for.
"""

from __future__ import annotations

import llvmlite.ir as ir
import numpy as np
from numba.core import types
from numba.cpython.unsafe.numbers import trailing_zeros
from numba.extending import intrinsic

from embedserve.tokenizer.kernel_cache import cached_njit

_ONES = np.uint64(0x0101010101010101)
_HIGH_BITS = np.uint64(0x8080808080808080)


@intrinsic
def load_u64(typingctx, array, index):
    """The 8 bytes of a uint8 array from ``index`` on, as a little-endian uint64 (an
    unaligned load; the caller keeps index + 8 within the array)."""
    def codegen(context, builder, signature, args):
        data = context.make_array(signature.args[0])(context, builder, args[0]).data
        address = builder.bitcast(builder.gep(data, [args[1]]), ir.IntType(64).as_pointer())
        return builder.load(address, align=1)
    return types.uint64(array, index), codegen


@intrinsic
def store_u64(typingctx, array, index, value):
    """Write ``value`` (a uint64) as the 8 bytes of a uint8 array from ``index`` on,
    little-endian (an unaligned store; the caller keeps index + 8 within the array)."""
    def codegen(context, builder, signature, args):
        data = context.make_array(signature.args[0])(context, builder, args[0]).data
        address = builder.bitcast(builder.gep(data, [args[1]]), ir.IntType(64).as_pointer())
        builder.store(args[2], address, align=1)
        return context.get_dummy_value()
    return types.void(array, index, value), codegen


@cached_njit(nogil=True, inline="always")
def high_bits(word):
    """The high bit of each byte of ``word`` that is 0x80 or more, the rest cleared."""
    return word & _HIGH_BITS


@cached_njit(nogil=True, inline="always")
def outside_printable(word, lowest):
    """``word`` with the high bit of each byte outside [lowest, 0x7E] set (``lowest``
    1-0x7E: a control character, DEL, a byte of a multi-byte character) and all other
    bits cleared, up to the first such byte: a borrow or carry from it may mark bytes
    above it, so only the lowest set bit (``leading_run``) is exact."""
    below = (word - _ONES * np.uint64(lowest)) & ~word
    above = word + _ONES  # a byte of 0x7F or more reaches (or has) its high bit
    return (below | above | word) & _HIGH_BITS


@cached_njit(nogil=True, inline="always")
def leading_run(marks):
    """How many bytes of a word come before the first marked one (8: none marked)."""
    if marks == np.uint64(0):
        return 8
    return np.int64(trailing_zeros(marks)) >> 3
