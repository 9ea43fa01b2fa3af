"""Quantized embedding precisions, in NumPy: the arithmetic only.

Owns what each precision name means and how a float32 batch becomes it,
bit-for-bit as ``sentence_transformers.quantize_embeddings`` computes it, so a
vector from embedserve and one quantized by sentence-transformers with the
same ranges compare equal:

- ``float32``: unchanged; ``float16``: a cast (sentence-transformers has none).
- ``int8`` / ``uint8``: per dimension, 256 buckets of equal width between that
  dimension's calibrated minimum and maximum (``ranges`` [2, d]); values
  outside the range clip to the end buckets. ``int8`` is the bucket minus 128.
- ``ubinary``: one bit per dimension (1 where the value is > 0), packed
  big-endian into uint8 [B, ceil(d / 8)]; ``binary`` is that byte minus 128,
  as int8.

Knows nothing about where ranges come from (which model, which sample, which
file): ``calibrate`` turns a sample's vectors into ranges, and the caller
keeps them. Torch-free, so every tier may import it.
"""

from __future__ import annotations

import numpy as np

from embedserve.errors import InvalidInput

PRECISIONS: tuple[str, ...] = ("float32", "float16", "int8", "uint8", "binary", "ubinary")
# Precisions whose buckets depend on calibrated per-dimension ranges.
RANGED_PRECISIONS: tuple[str, ...] = ("int8", "uint8")

_DTYPES: dict[str, np.dtype] = {
    "float32": np.dtype(np.float32), "float16": np.dtype(np.float16),
    "int8": np.dtype(np.int8), "uint8": np.dtype(np.uint8),
    "binary": np.dtype(np.int8), "ubinary": np.dtype(np.uint8),
}


def check_precision(precision: str, field: str = "precision") -> str:
    """``precision`` itself, or InvalidInput naming ``field`` and the accepted names."""
    if precision not in PRECISIONS:
        raise InvalidInput(f"unknown precision {precision!r}; expected one of "
                           f"{', '.join(PRECISIONS)}", field=field)
    return precision


def output_dtype(precision: str) -> np.dtype:
    """The dtype ``quantize`` returns for ``precision``."""
    return _DTYPES[check_precision(precision)]


def output_width(precision: str, dim: int) -> int:
    """Columns ``quantize`` returns for ``dim``-wide vectors: ceil(dim / 8) when bit-packed."""
    check_precision(precision)
    return (dim + 7) // 8 if precision.endswith("binary") else dim


def calibrate(vectors: np.ndarray) -> np.ndarray:
    """Per-dimension [min; max] of a calibration sample: float32 [N, d] -> float32 [2, d]."""
    vectors = np.asarray(vectors, dtype=np.float32)
    if vectors.ndim != 2 or vectors.shape[0] < 2:
        raise InvalidInput(f"calibration needs at least two [N, d] vectors, got shape "
                           f"{vectors.shape}", field="calibration")
    return np.vstack((vectors.min(axis=0), vectors.max(axis=0))).astype(np.float32)


def quantize(vectors: np.ndarray, precision: str,
             ranges: np.ndarray | None = None) -> np.ndarray:
    """float32 [B, d] -> ``precision`` [B, d] (or [B, ceil(d/8)] bit-packed).

    ``ranges`` (float32 [2, d]: per-dimension min and max) is required for
    int8/uint8 and ignored otherwise. The float32 arithmetic is
    sentence-transformers', step for step, so the buckets agree bit for bit.
    """
    check_precision(precision)
    vectors = np.asarray(vectors, dtype=np.float32)
    if vectors.ndim != 2:
        raise InvalidInput(f"expected [B, d] vectors, got shape {vectors.shape}")
    if precision == "float32":
        return vectors
    if precision == "float16":
        return vectors.astype(np.float16)
    if precision in RANGED_PRECISIONS:
        buckets = _buckets(vectors, _checked_ranges(ranges, vectors.shape[1], precision))
        if precision == "uint8":
            return buckets.astype(np.uint8)
        return (buckets - 128).astype(np.int8)
    packed = np.packbits(vectors > 0, axis=-1)  # uint8 [B, ceil(d/8)], first dim in the high bit
    if precision == "ubinary":
        return packed
    return (packed.astype(np.int16) - 128).astype(np.int8)


def _checked_ranges(ranges: np.ndarray | None, dim: int, precision: str) -> np.ndarray:
    if ranges is None:
        raise InvalidInput(f"{precision} needs calibration ranges", field="precision")
    ranges = np.asarray(ranges, dtype=np.float32)
    if ranges.shape != (2, dim):
        raise InvalidInput(f"ranges of shape {ranges.shape} for {dim}-dimensional vectors; "
                           f"expected (2, {dim})", field="precision")
    return ranges


def _buckets(vectors: np.ndarray, ranges: np.ndarray) -> np.ndarray:
    """float32 [B, d] -> float32 bucket numbers in [0, 255], per dimension."""
    starts = ranges[0]
    steps = (ranges[1] - starts) / np.float32(255)
    steps = np.where(steps == 0, np.float32(1), steps)  # a constant dimension: every value bucket 0
    return np.clip(np.floor((vectors - starts) / steps), 0, 255)
