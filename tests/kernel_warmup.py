"""Compile the tokenizer's kernels into Numba's on-disk cache, in a process of its own.

In a fresh checkout nothing is cached yet, and the first test that loads each kind of
native tokenizer (WordPiece, SentencePiece's Unigram, Hugging Face's Unigram) pays its
compile, tens of seconds on one core; a test or server that needs a kernel another
process is compiling waits for it (the kernel lock, embedserve/tokenizer/kernel_cache.py),
leaving its core idle. tests/kernel_warmup_plugin.py starts this script beside the
session (serial, or xdist's workers) so that such idle time compiles what later tests
need. The order is chosen for that: the suite's first tests compile Hugging Face mode's
``encode_batch()`` kernel themselves at once, so this starts with its ``encode()``
kernel (a worker would wait for it next), then SentencePiece's and WordPiece's. Where
the kernels are cached already it only loads them (~2.5 s of CPU).

Usage: python kernel_warmup.py MINILM_DIR TRIE_CACHE_DIR
(the default model is built, or found, in the cache ``embedserve serve`` uses)
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from embedserve.defaults.build import ensure_default_model
from embedserve.defaults.model_args import default_cache_dir
from embedserve.launch.processes import die_with_parent
from embedserve.tokenizer import Tokenizer

TEXTS = ["Hello, world! A first text.", "Привет, мир", "日本語のテキスト", "naïve café", ""]


def exercise(tokenizer: Tokenizer) -> None:
    """Every kernel signature a tokenizer's encode calls compile."""
    tokenizer.encode(TEXTS[0])
    tokenizer.encode_batch(TEXTS)
    tokenizer.encode_batch(TEXTS, max_length=8, truncation="right", return_offsets=True)
    tokenizer.encode_pairs(TEXTS[0], TEXTS[1:])


def main(minilm_dir: Path, trie_cache: Path) -> None:
    default_model_dir = ensure_default_model(default_cache_dir())
    hf = Tokenizer.from_file(default_model_dir / "tokenizer.json", "hf", cache_dir=trie_cache)
    hf.encode(TEXTS[0])
    exercise(Tokenizer.from_file(default_model_dir / "sentencepiece.bpe.model", "sentencepiece",
                                 cache_dir=trie_cache))
    exercise(Tokenizer.from_file(minilm_dir / "tokenizer.json", cache_dir=trie_cache))
    exercise(hf)


if __name__ == "__main__":
    die_with_parent(os.environ)
    os.nice(5)  # the tests' own processes come first; this only fills a core they leave idle
    main(*(Path(arg) for arg in sys.argv[1:]))
