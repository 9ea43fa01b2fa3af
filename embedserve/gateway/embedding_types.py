"""Cohere-style ``embedding_types``: which precisions a request asks for, and their JSON.

Owns the public names (``float``, ``int8``, ``uint8``, ``binary``,
``ubinary``, and the extension ``float16``), their mapping onto
``embedserve.model.quantize``'s precisions, the 400 for a name it does not
know, and turning each returned array into JSON rows (numbers, or with
``encoding_format=base64`` each row's little-endian bytes in base64). The
quantization itself happens in the replicas.
"""

from __future__ import annotations

import base64
from collections.abc import Sequence

import numpy as np

from embedserve.errors import InvalidInput

# Public name -> embedserve.model.quantize precision.
EMBEDDING_TYPES: dict[str, str] = {"float": "float32", "float16": "float16", "int8": "int8",
                                   "uint8": "uint8", "binary": "binary", "ubinary": "ubinary"}


def check_embedding_types(types: Sequence[str], field: str = "embedding_types") -> list[str]:
    """The requested types, each once in the order first asked; 400 naming an unknown one."""
    for i, name in enumerate(types):
        if name not in EMBEDDING_TYPES:
            raise InvalidInput(f"{field}[{i}]: unknown embedding type {name!r}; expected one of "
                               f"{', '.join(EMBEDDING_TYPES)}", field=f"{field}[{i}]")
    return list(dict.fromkeys(types))


def precisions(types: Sequence[str]) -> list[str]:
    """Checked type names -> the precisions replicas quantize to."""
    return [EMBEDDING_TYPES[name] for name in types]


def json_rows(array: np.ndarray, as_base64: bool) -> list:
    """[B, w] -> B JSON rows: arrays of numbers (for ``routes.embed.json_response``), or base64
    strings of little-endian bytes.

    Float rows are widened to float64 first: their JSON is then the shortest text of the
    same double ``float(x)`` gives (what ``json.dumps(array.tolist())`` wrote), which
    reads back as exactly the float32 or float16 value.
    """
    if not as_base64:
        dtype = np.float64 if np.issubdtype(array.dtype, np.floating) else array.dtype
        return list(np.ascontiguousarray(array, dtype=dtype))
    little = array.astype(array.dtype.newbyteorder("<"), copy=False)
    return [base64.b64encode(row.tobytes()).decode("ascii") for row in little]
