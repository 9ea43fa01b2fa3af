"""The columns of embedded output, as Arrow: one schema for every writer.

``id`` (int64 row numbers, or strings from ``--id-field``), ``embedding``
(a fixed-size list of the precision's numbers, or fixed-size binary of
``ceil(d / 8)`` bytes for packed bits), ``tokens`` (int32, specials included, after truncation),
``truncated`` and ``chunked`` (bool). The single-process writer, the Ray
actors and the ``--format npy`` export all build their tables here, so the
files they write agree column for column.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from embedserve.local.precision import PACKED_PRECISIONS, output_dtype, output_width

ID = "id"
EMBEDDING = "embedding"
TOKENS = "tokens"
TRUNCATED = "truncated"
CHUNKED = "chunked"
# A sparse (SPLADE) model's vector instead of ``embedding``: its nonzeros, by ascending index.
INDICES = "indices"
VALUES = "values"

_VALUE_TYPES = {"float32": pa.float32(), "float16": pa.float16(), "int8": pa.int8(), "uint8": pa.uint8()}


def embedding_type(precision: str, dimension: int) -> pa.DataType:
    if precision in PACKED_PRECISIONS:
        return pa.binary(output_width(precision, dimension))
    return pa.list_(_VALUE_TYPES[precision], dimension)


def output_schema(id_type: pa.DataType, precision: str, dimension: int) -> pa.Schema:
    return pa.schema([(ID, id_type), (EMBEDDING, embedding_type(precision, dimension)),
                      (TOKENS, pa.int32()), (TRUNCATED, pa.bool_()), (CHUNKED, pa.bool_())])


def sparse_schema(id_type: pa.DataType) -> pa.Schema:
    return pa.schema([(ID, id_type), (INDICES, pa.list_(pa.int32())), (VALUES, pa.list_(pa.float32())),
                      (TOKENS, pa.int32()), (TRUNCATED, pa.bool_()), (CHUNKED, pa.bool_())])


def sparse_arrays(counts: np.ndarray, indices: np.ndarray, values: np.ndarray) -> tuple[pa.Array, pa.Array]:
    """Flat nonzeros and per-row counts -> the indices and values list columns (shared
    offsets, no copy per row)."""
    offsets = pa.array(np.concatenate([[0], np.cumsum(counts, dtype=np.int64)]).astype(np.int32))
    return (pa.ListArray.from_arrays(offsets, pa.array(indices, type=pa.int32())),
            pa.ListArray.from_arrays(offsets, pa.array(values, type=pa.float32())))


def token_vectors_array(counts: np.ndarray, vectors: np.ndarray) -> pa.Array:
    """A multi-vector model's rows -> the ``embedding`` column as list<list<float32>>: per
    row its token vectors (shared offsets, no copy per row)."""
    vectors = np.ascontiguousarray(vectors, dtype=np.float32)
    dim = vectors.shape[1] if vectors.ndim == 2 else 0
    inner = pa.ListArray.from_arrays(pa.array(np.arange(vectors.shape[0] + 1, dtype=np.int32) * dim),
                                     pa.array(vectors.reshape(-1), type=pa.float32()))
    outer = pa.array(np.concatenate([[0], np.cumsum(counts, dtype=np.int64)]).astype(np.int32))
    return pa.ListArray.from_arrays(outer, inner)


def token_vectors_schema(id_type: pa.DataType) -> pa.Schema:
    return pa.schema([(ID, id_type), (EMBEDDING, pa.list_(pa.list_(pa.float32()))),
                      (TOKENS, pa.int32()), (TRUNCATED, pa.bool_()), (CHUNKED, pa.bool_())])


def embedding_array(stored: np.ndarray, precision: str, dimension: int) -> pa.Array:
    """[B, d] numbers (or [B, ceil(d/8)] packed bytes) -> the embedding column, without a copy per row."""
    stored = np.ascontiguousarray(stored)
    rows = stored.shape[0]
    if precision in PACKED_PRECISIONS:
        buffer = pa.py_buffer(stored.view(np.uint8).tobytes())
        return pa.FixedSizeBinaryArray.from_buffers(embedding_type(precision, dimension), rows, [None, buffer])
    values = pa.array(stored.reshape(-1), type=_VALUE_TYPES[precision])
    return pa.FixedSizeListArray.from_arrays(values, dimension)


def embedding_matrix(column: pa.Array | pa.ChunkedArray, precision: str) -> np.ndarray:
    """The inverse of ``embedding_array``: [B, d], or [B, ceil(d/8)] packed bytes (int8 for
    ``binary``, uint8 for ``ubinary``, as ``quantize`` returns them)."""
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks()
    width = column.type.byte_width if precision in PACKED_PRECISIONS else column.type.list_size
    if precision in PACKED_PRECISIONS:
        data = np.frombuffer(column.buffers()[1], np.uint8, len(column) * width,
                             column.offset * width)
        return data.reshape(len(column), width).view(output_dtype(precision))
    return column.flatten().to_numpy(zero_copy_only=False).reshape(len(column), width)
