"""The dtype probe's and calibration's token ids, kept on disk between starts.

Tokenizing a dozen fixed texts is nothing, but loading the tokenizer for it is not:
``tokenizers`` reads the default model's 17 MB tokenizer.json in ~0.6 s, about as
long as the rest of the engine's load (weights, probe steps) together, and a directory
without a tokenizer.json loads the native encoder's Numba kernels (seconds). The ids
depend only on the texts, the model's tokenizer files and its length limit, so a start
after the first reads them from ``probe-<sha256>.npz`` instead.

The key hashes the contents of every tokenizer file the loaders read, so an edited or
replaced tokenizer gets new ids; an unreadable or corrupt entry is recomputed, and an
unwritable directory only costs the next start the same work again. Writes go to a
temporary name and are renamed into place, so replicas starting together never read
half a file.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
import zipfile
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

from embedserve import ragged
from embedserve.home_paths import expand_home
from embedserve.ragged import RaggedBatch

DEFAULT_PROBE_CACHE_DIR = Path("~/.cache/embedserve/probe-tokens")
# What the tokenizer loaders (embedserve/tokenizer/load.py, the ``tokenizers`` library)
# read from a model directory to decide the ids.
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json",
                   "sentencepiece.bpe.model", "vocab.txt")
_FORMAT = b"embedserve-probe-tokens-v1"


def cache_key(model_dir: Path, texts: Sequence[str], max_positions: int) -> str:
    """sha256 of the texts, the length limit and each tokenizer file present (name and bytes)."""
    h = hashlib.sha256(_FORMAT)
    h.update(f"{max_positions}\0{len(texts)}\0".encode())
    for text in texts:
        encoded = text.encode("utf-8", "surrogatepass")
        h.update(len(encoded).to_bytes(8, "little") + encoded)
    for name in TOKENIZER_FILES:
        path = model_dir / name
        if path.is_file():
            data = path.read_bytes()
            h.update(name.encode() + b"\0" + len(data).to_bytes(8, "little") + data)
    return h.hexdigest()


def cached_tokens(model_dir: Path, texts: Sequence[str], max_positions: int,
                  tokenize: Callable[[], RaggedBatch], cache_dir: Path | None = DEFAULT_PROBE_CACHE_DIR
                  ) -> RaggedBatch:
    """``tokenize()``'s batch of ``texts``, read from ``cache_dir`` when an earlier call
    stored it for the same tokenizer files and limit (``None``: no cache)."""
    directory = expand_home(cache_dir)
    if directory is None:   # no cache, or "~" with no home to expand to
        return tokenize()
    path = directory / f"probe-{cache_key(model_dir, texts, max_positions)}.npz"
    stored = _read(path, len(texts))
    if stored is not None:
        return stored
    batch = tokenize()
    _write(path, batch)
    return batch


def _read(path: Path, n_texts: int) -> RaggedBatch | None:
    try:
        with np.load(path, allow_pickle=False) as stored:
            token_ids, cu_seqlens = stored["token_ids"], stored["cu_seqlens"]
    except (OSError, ValueError, KeyError, zipfile.BadZipFile):
        return None
    if (token_ids.ndim != 1 or cu_seqlens.shape != (n_texts + 1,) or cu_seqlens[0] != 0
            or cu_seqlens[-1] != token_ids.shape[0] or (np.diff(cu_seqlens) < 0).any()):
        return None  # not what this module writes: recomputed, and replaced below
    return ragged.from_lengths(token_ids, np.diff(cu_seqlens))


def _write(path: Path, batch: RaggedBatch) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
        try:
            with os.fdopen(fd, "wb") as f:
                np.savez(f, token_ids=np.asarray(batch.token_ids, np.int32),
                         cu_seqlens=np.asarray(batch.cu_seqlens, np.int32))
            os.replace(tmp, path)
        except BaseException:
            os.unlink(tmp)
            raise
    except OSError:
        pass  # an unwritable cache only costs the next start the tokenizer load
