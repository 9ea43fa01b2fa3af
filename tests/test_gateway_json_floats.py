"""The embedding routes' JSON: orjson output reads back as exactly the values ``json.dumps``
of ``tolist()`` wrote before, and as exactly the float32 (float16) vectors the replicas
returned. Real arrays through the gateway's own ``json_rows`` and ``json_response``; the
reference is the standard library's ``json``."""

from __future__ import annotations

import base64
import json

import numpy as np
import pytest

from embedserve.gateway.embedding_types import json_rows
from embedserve.gateway.routes.embed import json_response


def _hard_float32(rows: int, width: int) -> np.ndarray:
    """Random unit-ish vectors plus the values float text most often gets wrong."""
    rng = np.random.default_rng(7)
    vectors = rng.standard_normal((rows, width)).astype(np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    special = np.array([0.0, -0.0, 1.0, -1.0, 1e-45, -1e-45, 1.1754944e-38, 3.4028235e38,
                        -3.4028235e38, 0.1, 1 / 3, 2 ** -24, 16777217.0, 1e-7, 123456.79],
                       dtype=np.float32)
    vectors[0, :special.size] = special
    # Every bit pattern's neighbourhood: random finite float32 from raw bits.
    bits = rng.integers(0, 2 ** 32, size=width, dtype=np.uint64).astype(np.uint32)
    raw = bits.view(np.float32)
    vectors[1] = np.where(np.isfinite(raw), raw, 0.5)
    return vectors


def _body(payload: object) -> bytes:
    return bytes(json_response(payload).body)


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_float_rows_read_back_exactly_as_before(dtype):
    vectors = _hard_float32(6, 384).astype(dtype)
    if dtype is np.float16:
        vectors[~np.isfinite(vectors)] = 1.0
    body = _body({"data": [{"embedding": e} for e in json_rows(vectors, False)]})
    parsed = np.array([d["embedding"] for d in json.loads(body)["data"]])
    before = np.array(json.loads(json.dumps(vectors.tolist())))
    assert parsed.dtype == np.float64
    # The same doubles as json.dumps wrote, bit for bit (signed zeros included) ...
    assert parsed.tobytes() == before.tobytes()
    # ... and each is exactly the replica's value.
    assert parsed.astype(dtype).tobytes() == vectors.tobytes()


def test_truncated_columns_and_integer_rows():
    vectors = _hard_float32(3, 64)[:, :16]          # a non-contiguous view (Matryoshka cut)
    parsed = json.loads(_body(json_rows(vectors, False)))
    assert np.array(parsed, dtype=np.float32).tobytes() == np.ascontiguousarray(vectors).tobytes()
    for dtype, values in ((np.int8, [-128, -1, 0, 1, 127]), (np.uint8, [0, 1, 128, 255])):
        array = np.array([values, values[::-1]], dtype=dtype)
        assert json.loads(_body({"rows": json_rows(array, False)})) == {"rows": array.tolist()}


def test_base64_rows_are_the_little_endian_bytes():
    vectors = _hard_float32(2, 32)
    rows = json.loads(_body(json_rows(vectors, True)))
    decoded = np.array([np.frombuffer(base64.b64decode(r), dtype="<f4") for r in rows])
    assert decoded.tobytes() == vectors.tobytes()


def test_plain_payloads_match_the_standard_library():
    payload = {"object": "list", "model": "m", "usage": {"prompt_tokens": 3, "total_tokens": 3},
               "text": "naïve ☃ \u2028 \"quoted\"", "score": 0.1 + 0.2, "none": None, "flag": True,
               "nested": [[1, 2], [], [-3]]}
    assert json.loads(_body(payload)) == json.loads(json.dumps(payload))
