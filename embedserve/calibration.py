"""A model's int8/uint8 calibration: computed once, kept in the cache, never changed.

Owns where a calibration lives, how it is made and how ranges come out of
it. The calibration of a model (its weights, its compute dtype) is the raw
pooled embeddings of ``CALIBRATION_TEXTS`` (model/calibration_texts.py),
each text once per named prompt of the model, as float32 [N, dim] in
``sample.npy``. Ranges for a request's (dimensions, normalize) are derived
from it exactly as the request's vectors are: ``postprocess_embeddings``
(truncate, then renormalize) and then per-dimension min/max; each derived
ranges array is written beside the sample the first time it is asked for
and read back from then on, so the bytes never change once written.

Every file is written to a temporary name and linked into place; when two
processes calibrate at once the first link wins and the other adopts the
winner's file, so every replica and every in-process user (the bulk
command) sharing a cache directory quantizes with the same ranges.

    calibration = load_or_calibrate(directory, model_dir, info, embed)
    ranges = calibration.ranges(dimensions=256, normalize=True)   # float32 [2, 256]

Torch-free: ``embed`` (raw pooled vectors for a ``RaggedBatch``) is the
caller's engine. Replicas on different hosts agree only if they share the
cache directory (or a copy of it): a calibration is computed on one
machine and read everywhere else.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import tempfile
from collections.abc import Callable
from pathlib import Path

import numpy as np

from embedserve.model.calibration_texts import CALIBRATION_TEXTS, TEXTS_ID
from embedserve.model.info import ModelInfo
from embedserve.model.postprocess import postprocess_embeddings
from embedserve.model.quantize import calibrate
from embedserve.ragged import RaggedBatch

log = logging.getLogger(__name__)

SAMPLE_FILE = "sample.npy"
META_FILE = "calibration.json"
# Weight files are fingerprinted by size plus their first and last bytes: a
# different checkpoint of the same shape differs there (the embedding table
# comes first), and hashing gigabytes at every start would cost seconds.
_FINGERPRINT_EDGE = 4 << 20
_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth")

Embed = Callable[[RaggedBatch], np.ndarray]   # tokens -> raw pooled float32 [B, dim]


class Calibration:
    """One model's calibration sample and the ranges derived from it (memoized, file-backed)."""

    def __init__(self, directory: Path, sample: np.ndarray) -> None:
        self.directory = directory
        self.sample = sample                                  # float32 [N, dim], raw pooled
        self.calibration_id = _digest(sample.tobytes())[:16]
        self._ranges: dict[tuple[int, bool], np.ndarray] = {}

    @property
    def sample_size(self) -> int:
        return int(self.sample.shape[0])

    def ranges(self, dimensions: int | None, normalize: bool) -> np.ndarray:
        """float32 [2, d]: per-dimension min and max of the sample post-processed like a request."""
        dims = dimensions or int(self.sample.shape[1])
        key = (dims, bool(normalize))
        if key not in self._ranges:
            path = self.directory / f"ranges-{dims}-{'normalized' if normalize else 'raw'}.npy"
            ranges = _read_array(path)
            if ranges is None:
                derived = calibrate(postprocess_embeddings(self.sample, normalize, dims))
                try:
                    ranges = _write_once(path, derived)
                except OSError as error:
                    # A read-only cache (a calibration baked into an image): the ranges
                    # are a pure function of the stored sample, so use them unstored.
                    log.warning("cannot store %s (%s); using the ranges unstored", path, error)
                    ranges = derived
            self._ranges[key] = ranges
        return self._ranges[key]


def calibration_dir(cache_dir: Path, model_dir: Path, dtype: str) -> Path:
    """Where the calibration of ``model_dir`` computed in ``dtype`` lives under ``cache_dir``."""
    name = f"{Path(model_dir).resolve().name}-{model_fingerprint(model_dir)[:16]}-{dtype}-{TEXTS_ID}"
    return Path(cache_dir) / "calibration" / name


def model_fingerprint(model_dir: Path) -> str:
    """A digest of the model's config and weights (sizes and edges of each weight file)."""
    model_dir = Path(model_dir)
    h = hashlib.sha256()
    for name in ("config.json", "modules.json", "1_Pooling/config.json"):
        path = model_dir / name
        if path.exists():
            h.update(name.encode() + b"\0" + path.read_bytes())
    for path in sorted(p for p in model_dir.iterdir() if p.suffix in _WEIGHT_SUFFIXES):
        size = path.stat().st_size
        h.update(f"{path.name}\0{size}\0".encode())
        with path.open("rb") as f:
            h.update(f.read(_FINGERPRINT_EDGE))
            if size > 2 * _FINGERPRINT_EDGE:
                f.seek(size - _FINGERPRINT_EDGE)
                h.update(f.read())
    return h.hexdigest()


def load_calibration(directory: Path) -> Calibration | None:
    """The calibration stored in ``directory``, or None when there is none yet."""
    sample = _read_array(Path(directory) / SAMPLE_FILE)
    return None if sample is None else Calibration(Path(directory), sample)


def calibration_batches(model_dir: Path, info: ModelInfo, max_tokens: int,
                        max_sequences: int) -> list[RaggedBatch]:
    """The sample tokenized with the model's tokenizer (each text under each of its
    prompts, cut to fit ``max_tokens``), in batches of at most ``max_tokens`` tokens and
    ``max_sequences`` sequences."""
    # Here, not at the top: a replica imports this module at every start but tokenizes
    # only the one time it computes a calibration. A tokenizer.json is read by the
    # tokenizers library, whose ids the native encoder's equal (its parity reference):
    # the native encoder would compile its Numba kernels first on a fresh install, tens
    # of seconds of the replica's start (docs/startup.md).
    from embedserve.tokenizer import HfTokenizer, load_tokenizer

    json_path = Path(model_dir) / "tokenizer.json"
    tokenizer = HfTokenizer.from_file(json_path) if json_path.is_file() else load_tokenizer(model_dir)
    prompts = [info.prompts[name] for name in sorted(info.prompts)] or [""]
    texts = [prompt + text for prompt in prompts for text in CALIBRATION_TEXTS]
    encoded = tokenizer.encode_batch(texts, max_length=min(info.max_positions, max_tokens),
                                     truncation="right")
    batches, start, lengths = [], 0, encoded.lengths
    while start < len(texts):
        stop, tokens = start, 0
        while stop < len(texts) and stop - start < max_sequences and tokens + lengths[stop] <= max_tokens:
            tokens += int(lengths[stop])
            stop += 1
        batches.append(encoded.slice(start, stop))
        start = stop
    return batches


def store_calibration(directory: Path, sample: np.ndarray, model_dir: Path,
                      info: ModelInfo) -> Calibration:
    """Store ``sample`` (raw pooled float32 [N, dim]) as the calibration in ``directory``,
    unless one is there already: what it returns is what the directory holds."""
    directory.mkdir(parents=True, exist_ok=True)
    meta = {"model_dir": str(Path(model_dir).resolve()), "model_id": info.model_id,
            "dtype": info.dtype, "device": info.device, "texts_id": TEXTS_ID,
            "texts": len(CALIBRATION_TEXTS), "prompts": sorted(info.prompts),
            "sample_size": int(sample.shape[0])}
    # Informational (how the sample was made); like the sample, the first writer's stays.
    _write_once_bytes(directory / META_FILE, json.dumps(meta, indent=2).encode())
    return Calibration(directory, _write_once(directory / SAMPLE_FILE, sample))


def load_or_calibrate(directory: Path, model_dir: Path, info: ModelInfo, embed: Embed,
                      max_tokens: int = 512, max_sequences: int = 64) -> Calibration:
    """The stored calibration, or a new one computed with ``embed`` and stored.

    The synchronous path, for an in-process engine: ``embed`` is e.g.
    ``lambda tokens: engine.step(Batch.of(tokens)).wait()``.
    """
    found = load_calibration(directory)
    if found is not None:
        return found
    batches = calibration_batches(model_dir, info, max_tokens, max_sequences)
    sample = np.concatenate([np.asarray(embed(b), dtype=np.float32) for b in batches], axis=0)
    return store_calibration(directory, sample, model_dir, info)


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _read_array(path: Path) -> np.ndarray | None:
    try:
        return np.load(path, allow_pickle=False)
    except FileNotFoundError:
        return None


def _write_once(path: Path, array: np.ndarray) -> np.ndarray:
    """Store ``array`` at ``path`` unless a file is already there; return what ``path`` holds."""
    with tempfile.NamedTemporaryFile(dir=path.parent, prefix=path.name, suffix=".tmp",
                                     delete=False) as f:
        np.save(f, np.ascontiguousarray(array, dtype=np.float32), allow_pickle=False)
        f.flush()
        os.fsync(f.fileno())
    return np.load(path, allow_pickle=False) if not _link_into_place(Path(f.name), path) \
        else np.ascontiguousarray(array, dtype=np.float32)


def _write_once_bytes(path: Path, data: bytes) -> None:
    with tempfile.NamedTemporaryFile(dir=path.parent, prefix=path.name, suffix=".tmp",
                                     delete=False) as f:
        f.write(data)
    _link_into_place(Path(f.name), path)


def _link_into_place(temporary: Path, path: Path) -> bool:
    """Hard-link ``temporary`` to ``path`` (never replacing a file there); True if ours won."""
    try:
        os.link(temporary, path)
        return True
    except FileExistsError:
        return False
    finally:
        temporary.unlink()
