"""Arrays backed by transparent huge pages, for the tokenizer's big random-access tables.

Viterbi walks the vocabulary trie (about 13 MB for XLM-R's 250k pieces) one dependent
load at a time, and hf mode's per-word cache (8 MiB a thread) is probed at a hash. On
4 KiB pages such loads can also miss the TLB; on 2 MiB pages the whole trie needs a few
entries. Measured on multilingual text at 512 tokens (BENCHMARKS.md, tokenizer
section): both modes 5-9 % faster on a quiet machine when encoding is all the process
does; 17-25 % faster when other large tables are walked between calls (as a server's
other work does), which evicts a 4 KiB-page trie's TLB entries.

Linux backs a 2 MiB-aligned anonymous mapping with huge pages when the mapping asks for
them (``madvise(MADV_HUGEPAGE)``) and the system's THP setting is ``madvise`` or
``always``. Where it is ``never``, or on systems without ``madvise``, the arrays are
ordinary anonymous memory: the same values, only without the speed-up.
"""

from __future__ import annotations

import mmap

import numpy as np

HUGE_PAGE_BYTES = 2 << 20
# Smaller tables fit the TLB's reach on ordinary pages; a mapping of their own would
# only round them up to 2 MiB.
MIN_BYTES = HUGE_PAGE_BYTES


def huge_page_zeros(shape: int | tuple[int, ...], dtype: np.dtype | type) -> np.ndarray:
    """A zeroed C-contiguous array whose data starts on a 2 MiB boundary of a mapping
    that asks for huge pages (a plain ``np.zeros`` below ``MIN_BYTES``).

    The array keeps its mapping alive (numpy holds the buffer's owner); the memory is
    returned when the last view of it goes.
    """
    dtype = np.dtype(dtype)
    count = int(np.prod(shape, dtype=np.int64))
    nbytes = count * dtype.itemsize
    if nbytes < MIN_BYTES:
        return np.zeros(shape, dtype)
    # One page more than needed, so the data can start at an aligned address inside it.
    mapping = mmap.mmap(-1, nbytes + HUGE_PAGE_BYTES, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    advice = getattr(mmap, "MADV_HUGEPAGE", None)
    if advice is not None:
        try:
            mapping.madvise(advice)
        except OSError:
            pass  # THP compiled out: ordinary pages, same values
    raw = np.frombuffer(mapping, np.uint8)
    offset = -raw.ctypes.data % HUGE_PAGE_BYTES
    # Fresh anonymous memory reads as zeros; nothing is written until it is used.
    return raw[offset:offset + nbytes].view(dtype).reshape(shape)


def on_huge_pages(array: np.ndarray) -> np.ndarray:
    """A writable copy of ``array`` (a memory map too) in ``huge_page_zeros`` memory."""
    copy = huge_page_zeros(array.shape, array.dtype)
    copy[...] = array
    return copy
