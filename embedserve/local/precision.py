"""Output precisions of a bulk job: float vectors as stored, or quantized.

``float32`` and ``float16`` are casts of the (normalized, Matryoshka-cut)
float32 vectors. ``int8``, ``uint8``, ``binary`` and ``ubinary`` are
sentence-transformers' ``quantize_embeddings`` schemes; they come from
``embedserve.model.quantize`` (its ``quantize`` and calibration ranges) once
that module is in the tree, and are refused with a clear message until then.
Packed-bit precisions are stored as ``dim / 8`` bytes per vector.
"""

from __future__ import annotations

import numpy as np

from embedserve.errors import InvalidInput

PRECISIONS = ("float32", "float16", "int8", "uint8", "binary", "ubinary")
FLOAT_PRECISIONS = {"float32": np.float32, "float16": np.float16}
PACKED_PRECISIONS = ("binary", "ubinary")


def check_precision(precision: str, dimension: int) -> None:
    """Raise InvalidInput unless ``precision`` can be produced for ``dimension``-wide vectors."""
    if precision not in PRECISIONS:
        raise InvalidInput(f"precision must be one of {', '.join(PRECISIONS)}, got {precision!r}",
                           field="precision")
    if precision in PACKED_PRECISIONS and dimension % 8:
        raise InvalidInput(f"precision {precision} packs 8 dimensions per byte; {dimension} is not "
                           "a multiple of 8", field="precision")
    if precision not in FLOAT_PRECISIONS:
        raise InvalidInput(f"precision {precision} needs embedserve.model.quantize, which this "
                           "build does not have yet; use float32 or float16", field="precision")


def convert(vectors: np.ndarray, precision: str) -> np.ndarray:
    """float32 [B, d] -> the stored array: [B, d] of the precision's dtype, or packed bytes [B, d/8]."""
    if precision in FLOAT_PRECISIONS:
        return np.ascontiguousarray(vectors, dtype=FLOAT_PRECISIONS[precision])
    raise InvalidInput(f"precision {precision} is not available in this build", field="precision")
