"""Compile the tokenizer's kernels into Numba's on-disk cache, in a process of its own.

In a fresh checkout nothing is cached yet, and the first test that loads each kind of
native tokenizer (WordPiece, SentencePiece's Unigram, Hugging Face's Unigram) would
pay its compile, tens of seconds on one core. conftest.py starts this script when a
serial session starts, so another core compiles while the first runs tests; where the
kernels are cached already it only loads them. The cache is the one every process of
this checkout reads and writes (embedserve/tokenizer/kernel_cache.py), so the test
process and the servers it starts load what this one compiled, or wait for it to
finish a kernel they need. Hugging Face's mode comes last: the suite's first tests
compile it themselves at once. Under xdist it does not run: both cores run tests
already, and the kernel lock keeps the workers from compiling a kernel twice.

Usage: python kernel_warmup.py DEFAULT_MODEL_DIR MINILM_DIR TRIE_CACHE_DIR
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from embedserve.launch.processes import die_with_parent
from embedserve.tokenizer import Tokenizer

TEXTS = ["Hello, world! A first text.", "Привет, мир", "日本語のテキスト", "naïve café", ""]


def exercise(tokenizer: Tokenizer) -> None:
    """Every kernel signature a tokenizer's encode calls compile."""
    tokenizer.encode(TEXTS[0])
    tokenizer.encode_batch(TEXTS)
    tokenizer.encode_batch(TEXTS, max_length=8, truncation="right", return_offsets=True)
    tokenizer.encode_pairs(TEXTS[0], TEXTS[1:])


def main(default_model_dir: Path, minilm_dir: Path, trie_cache: Path) -> None:
    exercise(Tokenizer.from_file(minilm_dir / "tokenizer.json", cache_dir=trie_cache))
    exercise(Tokenizer.from_file(default_model_dir / "sentencepiece.bpe.model", "sentencepiece",
                                 cache_dir=trie_cache))
    exercise(Tokenizer.from_file(default_model_dir / "tokenizer.json", "hf", cache_dir=trie_cache))


if __name__ == "__main__":
    die_with_parent(os.environ)
    os.nice(5)  # the tests' own processes come first; this only fills a core they leave idle
    main(*(Path(arg) for arg in sys.argv[1:]))
