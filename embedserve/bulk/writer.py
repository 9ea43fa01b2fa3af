"""Writing a job's files: finished parts, then the output and the errors file.

A part is written under a temporary name and renamed when complete, its
errors beside it the same way, so a part file that exists is whole. The
final output is assembled from the part files in order (Parquet: one row
group per part; npy: a float matrix written through a memory map plus the ids
as JSON Lines), again under a temporary name first. The bytes depend only on
the parts' contents, so a resumed job writes the same file an uninterrupted
one does.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from embedserve.bulk.job import JobPaths
from embedserve.bulk.manifest import write_atomic
from embedserve.local import columns
from embedserve.local.embedded import SparseRows, TokenVectorRows
from embedserve.local.precision import PACKED_PRECISIONS, output_dtype

# Parquet settings fixed here so that every run writes identical bytes.
_PARQUET = dict(compression="zstd", write_statistics=False)


def part_table(ids: list[Any], rows: np.ndarray, stored: np.ndarray, tokens: np.ndarray,
               truncated: np.ndarray, chunked: np.ndarray, id_type: pa.DataType, precision: str,
               dimension: int, sparse: SparseRows | None = None,
               token_vectors: TokenVectorRows | None = None) -> pa.Table:
    """The output rows of one part (``rows``: indices of the embedded rows in ``ids``);
    a sparse model's (``sparse``) as ``indices`` and ``values`` list columns, a
    multi-vector model's (``token_vectors``) as a list<list<float32>> ``embedding``."""
    if token_vectors is not None:
        return pa.Table.from_arrays(
            [pa.array([ids[i] for i in rows.tolist()], type=id_type),
             columns.token_vectors_array(token_vectors.counts, token_vectors.vectors),
             pa.array(tokens, type=pa.int32()), pa.array(truncated, type=pa.bool_()),
             pa.array(chunked, type=pa.bool_())], schema=columns.token_vectors_schema(id_type))
    if sparse is not None:
        indices, values = columns.sparse_arrays(sparse.counts, sparse.indices, sparse.values)
        return pa.Table.from_arrays(
            [pa.array([ids[i] for i in rows.tolist()], type=id_type), indices, values,
             pa.array(tokens, type=pa.int32()), pa.array(truncated, type=pa.bool_()),
             pa.array(chunked, type=pa.bool_())], schema=columns.sparse_schema(id_type))
    schema = columns.output_schema(id_type, precision, dimension)
    return pa.Table.from_arrays(
        [pa.array([ids[i] for i in rows.tolist()], type=id_type),
         columns.embedding_array(stored, precision, dimension),
         pa.array(tokens, type=pa.int32()), pa.array(truncated, type=pa.bool_()),
         pa.array(chunked, type=pa.bool_())], schema=schema)


def error_lines(records: Iterable[dict[str, Any]]) -> bytes:
    return b"".join(json.dumps(r, ensure_ascii=False).encode() + b"\n" for r in records)


def write_part(paths: JobPaths, index: int, table: pa.Table, errors: list[dict[str, Any]]) -> None:
    """The part's rows and its errors, each renamed into place once complete."""
    target = paths.part(index)
    tmp = target.with_name(target.name + ".tmp")
    pq.write_table(table, tmp, **_PARQUET)
    os.replace(tmp, target)
    write_atomic(paths.part_errors(index), error_lines(errors))


def assemble(paths: JobPaths, part_indices: list[int], precision: str) -> int:
    """Join the finished parts into the output (and the errors file); returns the row count."""
    if paths.format == "npy":
        rows = _assemble_npy(paths, part_indices, precision)
    else:
        rows = _assemble_parquet(paths, part_indices)
    tmp = paths.errors.with_name(paths.errors.name + ".tmp")
    with open(tmp, "wb") as out:
        for index in part_indices:
            out.write(paths.part_errors(index).read_bytes())
    os.replace(tmp, paths.errors)
    return rows


def _assemble_parquet(paths: JobPaths, part_indices: list[int]) -> int:
    tmp = paths.output.with_name(paths.output.name + ".tmp")
    schema = pq.read_schema(paths.part(part_indices[0]))
    rows = 0
    with pq.ParquetWriter(tmp, schema, **_PARQUET) as writer:
        for index in part_indices:
            table = pq.read_table(paths.part(index))
            writer.write_table(table, row_group_size=max(1, table.num_rows))
            rows += table.num_rows
    os.replace(tmp, paths.output)
    return rows


def _assemble_npy(paths: JobPaths, part_indices: list[int], precision: str) -> int:
    counts = [pq.read_metadata(paths.part(i)).num_rows for i in part_indices]
    first = pq.read_table(paths.part(part_indices[0]))
    embedding_type = first.schema.field(columns.EMBEDDING).type
    if precision in PACKED_PRECISIONS:
        dtype, width = output_dtype(precision), embedding_type.byte_width
    else:
        dtype, width = np.dtype(embedding_type.value_type.to_pandas_dtype()), embedding_type.list_size
    tmp = paths.output.with_name(paths.output.name + ".tmp.npy")
    matrix = np.lib.format.open_memmap(tmp, mode="w+", dtype=dtype, shape=(sum(counts), width))
    ids_tmp = paths.ids.with_name(paths.ids.name + ".tmp")
    row = 0
    with open(ids_tmp, "wb") as ids_out:
        for index, count in zip(part_indices, counts):
            table = pq.read_table(paths.part(index))
            matrix[row:row + count] = columns.embedding_matrix(table.column(columns.EMBEDDING), precision)
            ids_out.write(error_lines(table.column(columns.ID).to_pylist()))
            row += count
    matrix.flush()
    del matrix
    os.replace(ids_tmp, paths.ids)
    os.replace(tmp, paths.output)
    return row
