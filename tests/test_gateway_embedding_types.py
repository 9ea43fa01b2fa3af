"""gateway/embedding_types.py: Cohere's type names, their checks and their JSON rows."""

from __future__ import annotations

import base64

import numpy as np
import pytest

from embedserve.errors import InvalidInput
from embedserve.gateway.embedding_types import check_embedding_types, json_rows, precisions
from embedserve.model.quantize import PRECISIONS


def test_every_type_names_a_precision_and_repeats_collapse() -> None:
    types = check_embedding_types(["int8", "float", "int8", "ubinary", "float16", "uint8", "binary"])
    assert types == ["int8", "float", "ubinary", "float16", "uint8", "binary"]
    assert sorted(precisions(types)) == sorted(PRECISIONS)


@pytest.mark.parametrize("bad", ["float32", "INT8", "bit", ""])
def test_unknown_type_names_its_index(bad: str) -> None:
    with pytest.raises(InvalidInput) as caught:
        check_embedding_types(["float", bad])
    assert caught.value.field == "embedding_types[1]" and repr(bad) in str(caught.value)


@pytest.mark.parametrize("dtype", [np.int8, np.uint8, np.float16, np.float32])
def test_base64_rows_are_little_endian_bytes(dtype) -> None:
    array = (np.arange(12).reshape(3, 4) - 5).astype(dtype)
    rows = json_rows(array.astype(np.dtype(dtype).newbyteorder(">")), as_base64=True)
    decoded = np.stack([np.frombuffer(base64.b64decode(r), dtype=np.dtype(dtype).newbyteorder("<"))
                        for r in rows])
    assert np.array_equal(decoded, array)
    # Number rows are arrays for json_response (orjson writes them; test_gateway_json_floats.py).
    assert [row.tolist() for row in json_rows(array, as_base64=False)] == array.tolist()
