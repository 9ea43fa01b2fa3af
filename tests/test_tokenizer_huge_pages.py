"""The tokenizer's big tables live on transparent huge pages (tokenizer/huge_pages.py).

Viterbi's trie walk and the word cache's probes are dependent loads spread over tens of
MB, which on 4 KiB pages can also miss the TLB (BENCHMARKS.md, tokenizer section). The
tests read /proc/self/smaps, so they say whether the memory really is backed by 2 MiB
pages, not only that it was asked for.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import tokenizers

from embedserve.tokenizer import Tokenizer
from embedserve.tokenizer.huge_pages import HUGE_PAGE_BYTES, MIN_BYTES, huge_page_zeros, on_huge_pages

THP_SETTING = Path("/sys/kernel/mm/transparent_hugepage/enabled")
TEXTS = ["Hello world, this is a test.", "Всеобщая декларация прав человека", "人人生而自由，在尊严和权利上一律平等。",
         "सभी मनुष्यों को गौरव और अधिकारों के मामले में जन्मजात स्वतन्त्रता प्राप्त है।", "  spaces  and\ttabs\n"]


@pytest.fixture(scope="module")
def huge_pages_available() -> None:
    """Skip where the kernel would not back a madvised mapping with huge pages."""
    try:
        setting = THP_SETTING.read_text()
    except OSError:
        pytest.skip(f"{THP_SETTING} not found: no transparent huge pages on this system")
    if "[never]" in setting:
        pytest.skip(f"transparent huge pages are off here ({setting.strip()})")


def anon_huge_kib(address: int) -> int:
    """AnonHugePages (KiB) of the mapping of this process that holds ``address``."""
    inside = False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        head = line.split(maxsplit=1)[0]
        if "-" in head and not head.endswith(":"):
            low, high = (int(x, 16) for x in head.split("-"))
            inside = low <= address < high
        elif inside and head == "AnonHugePages:":
            return int(line.split()[1])
    raise AssertionError(f"no mapping holds {address:#x}")


def assert_on_huge_pages(array: np.ndarray) -> None:
    """``array`` starts on a 2 MiB boundary and is backed by at least one huge page. Where it
    is not backed, a fresh mapping is asked for one: a kernel that has no free huge page
    just then (memory fragmented by a busy machine; THP is best effort) gives none to
    either, and that is a skip, not a failure; one that gives the fresh mapping a huge page
    while ``array`` has none fails."""
    assert array.ctypes.data % HUGE_PAGE_BYTES == 0
    if anon_huge_kib(array.ctypes.data) >= HUGE_PAGE_BYTES // 1024:
        return
    probe = huge_page_zeros((HUGE_PAGE_BYTES,), np.uint8)
    probe[::4096] = 1
    if anon_huge_kib(probe.ctypes.data) < HUGE_PAGE_BYTES // 1024:
        pytest.skip("the kernel had no free huge page just now (fragmented memory): nothing to check")
    raise AssertionError(f"{array.nbytes} bytes at {array.ctypes.data:#x}: no huge page, while a fresh "
                         "mapping got one")


def test_zeros_are_aligned_zeroed_and_writable() -> None:
    array = huge_page_zeros((3 * HUGE_PAGE_BYTES // 8,), np.int64)
    assert array.shape == (3 * HUGE_PAGE_BYTES // 8,) and array.dtype == np.int64
    assert array.ctypes.data % HUGE_PAGE_BYTES == 0 and array.flags.c_contiguous and array.flags.writeable
    assert not array.any()
    array[-1] = 7
    assert array[-1] == 7


def test_small_arrays_are_ordinary_copies() -> None:
    small = np.arange(10, dtype=np.float32)
    copy = on_huge_pages(small)
    np.testing.assert_array_equal(copy, small)
    assert copy is not small and copy.flags.writeable
    assert huge_page_zeros((MIN_BYTES // 4 - 1,), np.int32).base is None  # a plain np.zeros


def test_a_read_only_memory_map_becomes_a_writable_copy(tmp_path) -> None:
    # How the trie cache is read: a mapped .npy, copied once (Numba types read-only arrays apart).
    source = np.arange(3 * HUGE_PAGE_BYTES // 8, dtype=np.int64)
    np.save(tmp_path / "a.npy", source)
    copy = on_huge_pages(np.load(tmp_path / "a.npy", mmap_mode="r"))
    np.testing.assert_array_equal(copy, source)
    assert copy.flags.writeable and not isinstance(copy, np.memmap)


def test_a_copy_has_the_same_values_on_huge_pages(huge_pages_available) -> None:
    source = np.random.default_rng(0).integers(0, 1 << 30, size=(4 * HUGE_PAGE_BYTES // 64, 16), dtype=np.int32)
    copy = on_huge_pages(source)
    np.testing.assert_array_equal(copy, source)
    assert_on_huge_pages(copy)


def test_the_trie_and_word_cache_are_on_huge_pages(huge_pages_available, default_model_dir: Path,
                                                    tmp_path: Path) -> None:
    reference = tokenizers.Tokenizer.from_file(str(default_model_dir / "tokenizer.json"))
    for _ in range(2):  # the trie built (an empty cache directory), then read back from it
        ours = Tokenizer.from_model_dir(default_model_dir, cache_dir=tmp_path)
        for text in TEXTS:
            assert ours.encode(text).tolist() == reference.encode(text).ids, text
        assert_on_huge_pages(ours._model.nodes)
        assert_on_huge_pages(ours._word_cache().records)
