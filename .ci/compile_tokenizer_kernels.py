"""Compile the tokenizer's Numba kernels into the tree's disk cache in both exactness modes.

CI runs this beside lint (.ci/run), so that the suite on a fresh checkout loads the kernels
rather than compiling them while its tests wait. A kernel is compiled per argument type,
not per vocabulary, so the default model's two files cover every model the suite
tokenizes natively: tokenizer.json in hf mode, its SentencePiece .model in sentencepiece
mode. The two modes compile in two processes, one per core.
"""

from __future__ import annotations

import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from embedserve.defaults.build import ensure_default_model
from embedserve.defaults.model_args import default_cache_dir
from embedserve.tokenizer import Tokenizer
from embedserve.tokenizer.kernel_cache import warming_up
from embedserve.tokenizer.spec import Compat
from embedserve.tokenizer.warm import warm_up

# The default model's max_length, which the gateway's warm-up passes too.
MAX_LENGTH = 512


def compile_mode(model_dir: Path, compat: Compat) -> Compat:
    """Every kernel a gateway route runs, for ``model_dir``'s tokenizer in ``compat`` mode."""
    with warming_up(compile=True):
        warm_up(Tokenizer.from_model_dir(model_dir, compat=compat), MAX_LENGTH)
    return compat


def main() -> int:
    model_dir = ensure_default_model(default_cache_dir())
    modes: list[Compat] = ["hf", "sentencepiece"]
    with ProcessPoolExecutor(max_workers=len(modes)) as pool:
        for compat in pool.map(compile_mode, [model_dir] * len(modes), modes):
            print(f"tokenizer kernels compiled: {compat} mode", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
