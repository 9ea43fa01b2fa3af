"""Output precisions of a bulk job, as ``embedserve.model.quantize`` defines them.

``float32`` / ``float16`` store the (normalized, Matryoshka-cut) vectors;
``int8`` / ``uint8`` bucket each dimension between calibrated ranges (the
model's calibration in the cache, ``embedserve.calibration``: the same
ranges a replica uses, so a bulk vector equals a served one); ``binary`` /
``ubinary`` pack one bit per dimension into ``ceil(d / 8)`` bytes. The
arithmetic is ``quantize``'s, bit-exact with sentence-transformers'
``quantize_embeddings``.
"""

from __future__ import annotations

import numpy as np

from embedserve.errors import InvalidInput
from embedserve.model.quantize import PRECISIONS, RANGED_PRECISIONS, output_dtype, output_width, quantize

__all__ = ["PRECISIONS", "RANGED_PRECISIONS", "PACKED_PRECISIONS", "check_precision", "convert",
           "output_dtype", "output_width"]

PACKED_PRECISIONS = ("binary", "ubinary")


def check_precision(precision: str, dimension: int) -> None:
    """Raise InvalidInput unless ``precision`` is a known name."""
    if precision not in PRECISIONS:
        raise InvalidInput(f"precision must be one of {', '.join(PRECISIONS)}, got {precision!r}",
                           field="precision")


def convert(vectors: np.ndarray, precision: str, ranges: np.ndarray | None = None) -> np.ndarray:
    """float32 [B, d] -> the stored array ([B, d] of the precision's dtype, or [B, ceil(d/8)] packed)."""
    if precision in RANGED_PRECISIONS and ranges is None:
        raise InvalidInput(f"precision {precision} needs the model's calibration ranges", field="precision")
    return np.ascontiguousarray(quantize(vectors, precision, ranges))
