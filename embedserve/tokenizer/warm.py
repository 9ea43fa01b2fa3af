"""A tokenizer's first calls made before it serves: every kernel a route runs, loaded or compiled.

Numba compiles a kernel for an argument signature on its first call (seconds to tens
of seconds on a fresh install: BENCHMARKS.md / docs/startup.md) and later processes
load it from the disk cache (kernel_cache.py). ``warm_up(tokenizer)`` makes those first
calls: the calls the gateway's routes make (one text, several, with truncation from
either side, with offsets, pairs, a batch large enough to run on the encoder's threads),
so that no request afterwards waits for a kernel. A ``tokenizers``-library tokenizer
has nothing to compile; the same calls cost it microseconds.

``load_warm(model_dir, compile=False)`` is a native tokenizer loaded and warmed from the
disk cache only, or ``None`` when the cache lacks a kernel it needs (``KernelNotCached``).
``python -m embedserve.tokenizer.warm MODEL_DIR`` (what the gateway starts beside
itself: ``compile_command``) loads and warms a model's tokenizer with compiling
allowed, so that the next ``load_warm`` finds everything on disk.
"""

from __future__ import annotations

import ctypes
import logging
import os
import signal
import sys
from pathlib import Path

from embedserve.tokenizer.backend import TokenizerBackend
from embedserve.tokenizer.kernel_cache import KernelNotCached, warming_up
from embedserve.tokenizer.load import load_tokenizer

log = logging.getLogger(__name__)

# Scripts and shapes enough to run every normalizer path a kernel holds; empty texts
# are refused before the tokenizer, so none here.
_TEXTS = ("Hello, world! A first text.", "Привет, мир", "日本語のテキスト", "naïve café")
# Over the native encoder's threshold for splitting a batch over its threads
# (tokenizer.PARALLEL_MIN_BYTES per thread), so the threads' first calls happen here too.
_LONG_TEXT = "a sentence of some length, " * 2600


def warm_up(tokenizer: TokenizerBackend, max_length: int = 8) -> None:
    """Every kernel signature a gateway route runs, called once (loaded or compiled).

    ``max_length``: the length requests are cut to (the model's): the native kernels
    take it as an argument, the ``tokenizers`` library keeps a tokenizer per length
    and side, built on first use (most of a second for a large vocabulary)."""
    one, *more = _TEXTS
    tokenizer.encode_batch([one])                                        # one text (a query)
    tokenizer.encode_batch(list(_TEXTS))                                 # several
    for side in ("right", "left"):                                       # truncate=true
        tokenizer.encode_batch([one], max_length=max_length, truncation=side)
        tokenizer.encode_batch(list(_TEXTS), max_length=max_length, truncation=side)
        tokenizer.encode_pairs(one, more, max_length=max_length, truncation=side)
    tokenizer.encode_batch(list(_TEXTS), return_offsets=True)            # /tokenize
    tokenizer.encode_batch([one], return_offsets=True)
    tokenizer.encode_pairs(one, more)                                    # /rerank
    tokenizer.encode_batch([_LONG_TEXT, _LONG_TEXT, _LONG_TEXT])         # on the encoder's threads
    tokenizer.encode(one)                                                # library callers


def load_warm(model_dir: Path, compile: bool = False, max_length: int = 8) -> TokenizerBackend | None:
    """``load_tokenizer(model_dir)`` warmed up (``warm_up``'s ``max_length``); ``compile=False``:
    only from the disk cache (None when a kernel it needs is not there, having compiled nothing)."""
    try:
        with warming_up(compile=compile):
            tokenizer = load_tokenizer(model_dir)
            warm_up(tokenizer, max_length)
    except KernelNotCached as missing:
        log.info("tokenizer kernels of %s not in the disk cache yet (%s)", model_dir, missing)
        return None
    return tokenizer


def compile_command(model_dir: Path) -> list[str]:
    """argv of a process that compiles ``model_dir``'s tokenizer kernels into the disk cache
    and exits 0: this interpreter, this copy of embedserve, this process as its parent."""
    package_parent = str(Path(__file__).resolve().parents[2])
    script = (f"import sys; sys.path.insert(0, {package_parent!r}); "
              "from embedserve.tokenizer.warm import main; sys.exit(main(sys.argv[1:]))")
    return [sys.executable, "-c", script, str(model_dir), str(os.getpid())]


_PR_SET_PDEATHSIG = 1


def main(argv: list[str]) -> int:
    """``MODEL_DIR PARENT_PID``: compile and cache the tokenizer's kernels, at low priority."""
    model_dir, parent = Path(argv[0]), int(argv[1])
    if sys.platform.startswith("linux"):  # as launch/processes.py's die_with_parent
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
        if os.getppid() != parent:
            return 1
    os.nice(10)  # requests (served meanwhile by the tokenizers library) and replicas first
    load_warm(model_dir, compile=True)
    return 0
