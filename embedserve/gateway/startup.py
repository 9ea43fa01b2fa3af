"""What the gateway does with a model before serving it: read it, pick and warm its tokenizer,
and later switch to the native tokenizer once its kernels are compiled.

The native encoder's Numba kernels compile on a fresh install (over a minute of CPU
for a Unigram tokenizer.json on a 2-core machine; docs/startup.md), and a request that
meets an uncompiled kernel waits for it. So the gateway serves no tokenizer before
every kernel its routes run has been called once (``tokenizer/warm.py``), and:

- the kernels are in the disk cache (every start after the first): the native
  tokenizer, loaded and warmed from the cache, serves from the start;
- they are not, and the model has a tokenizer.json: the ``tokenizers`` library serves
  it from the start (exact: it is the native encoder's parity reference, so ids are the
  same before and after the switch), while ``NativeSwitch`` compiles the kernels in a
  process of its own (low priority, the GIL left to requests), loads them from the
  cache here and swaps the native tokenizer in;
- they are not and there is no tokenizer.json (a SentencePiece .model or a BERT
  vocab.txt directory, which only the native encoder runs): compiled here, before the
  gateway serves.

``prepare_models`` is the seconds of a gateway's start that depend only on the model
directories, so ``embedserve serve`` runs it while its replicas start. Knows nothing
about HTTP; the app (app.py) runs the switches in its lifespan.
"""

from __future__ import annotations

import asyncio
import logging
import subprocess
from collections.abc import Iterable
from pathlib import Path
from typing import NamedTuple

from embedserve.gateway.preprocess import Preprocessor
from embedserve.model.info import ModelInfo, read_model_info
from embedserve.tokenizer import HfTokenizer, TokenizerBackend
from embedserve.tokenizer.warm import compile_command, load_warm, warm_up

log = logging.getLogger(__name__)


class PreparedModel(NamedTuple):
    """A model directory read and its tokenizer warmed, ready to serve."""

    info: ModelInfo
    tokenizer: TokenizerBackend
    switch_later: bool  # served by the tokenizers library until a NativeSwitch runs


def prepare_models(model_dirs: Iterable[Path]) -> dict[Path, PreparedModel]:
    """Each distinct directory (by its resolved path) read, with its warmed tokenizer.
    ModelLoadError when one cannot be served."""
    prepared: dict[Path, PreparedModel] = {}
    for model_dir in model_dirs:
        key = model_dir.resolve()
        if key not in prepared:
            info = read_model_info(model_dir)
            prepared[key] = PreparedModel(info, *start_tokenizer(model_dir, info.max_positions))
    return prepared


def start_tokenizer(model_dir: Path, max_length: int) -> tuple[TokenizerBackend, bool]:
    """(the warmed tokenizer to serve ``model_dir`` with now, whether a ``NativeSwitch``
    should replace it). ``max_length``: the model's, that truncating requests cut to."""
    native = load_warm(model_dir, max_length=max_length)
    if native is not None:
        return native, False
    json_path = model_dir / "tokenizer.json"
    if not json_path.is_file():
        log.info("compiling the tokenizer kernels of %s before serving (no tokenizer.json to "
                 "serve with meanwhile; once per install)", model_dir)
        compiled = load_warm(model_dir, compile=True, max_length=max_length)
        assert compiled is not None  # compile=True never answers None
        return compiled, False
    library = HfTokenizer.from_file(json_path)
    warm_up(library, max_length)
    log.info("tokenizer %s: served by the tokenizers library until the native kernels are "
             "compiled (once per install)", json_path)
    return library, True


class NativeSwitch:
    """Compiles a model's native tokenizer kernels in a child process, then puts the
    native tokenizer, warmed from the cache, into ``preprocessor`` in place of the
    library's. A failure leaves the library serving (logged): it is exact too."""

    def __init__(self, model_dir: Path, preprocessor: Preprocessor) -> None:
        self.model_dir = model_dir
        self.preprocessor = preprocessor

    async def run(self) -> None:
        """Compile, load, switch; cancelled (the app stops): the child is killed first."""
        # Popen, not asyncio's subprocess: under uvloop that runs Python between fork and
        # exec, which crashed children of this multi-threaded process (launch/processes.py).
        child = subprocess.Popen(compile_command(self.model_dir), stdin=subprocess.DEVNULL,  # noqa: ASYNC220
                                 stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        try:
            _, stderr = await asyncio.to_thread(child.communicate)
        finally:
            if child.poll() is None:
                child.kill()
                child.wait()
        if child.returncode != 0:
            log.warning("compiling the native tokenizer kernels of %s failed (exit status %s); the "
                        "tokenizers library goes on serving it: %s", self.model_dir, child.returncode,
                        stderr.decode(errors="replace").strip().splitlines()[-1:])
            return
        native = await asyncio.to_thread(load_warm, self.model_dir)
        if native is None:
            log.warning("the native tokenizer kernels of %s are still not in the disk cache after "
                        "compiling them (is the cache directory writable?); the tokenizers library "
                        "goes on serving it", self.model_dir)
            return
        self.preprocessor.tokenizer = native
        log.info("tokenizer of %s: switched to backend %s", self.model_dir, native.backend)
