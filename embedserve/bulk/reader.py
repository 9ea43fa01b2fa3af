"""Reading a job's input: files -> parts of N rows, streaming, in input order.

Accepts a file, a directory (its files, sorted) or a glob, in one of four
formats: JSON Lines, CSV, Parquet (pyarrow record batches) and plain text
(one document per line). Nothing is read whole: Parquet and CSV come as
pyarrow record batches, JSON Lines and text line by line. JSON Lines is
parsed per line (not by pyarrow's JSON reader) so that one bad line, or a
field that is a number on one line and a string on the next, is one bad row
rather than a failed block.

Every row gets an id: the ``--id-field`` value (as a string), else its
position: the row number (from 0) for tables, the line number (from 1) for
text. A row whose text is unusable keeps its place with a reason
(``documents.text_problem``); the run writes it to the errors file.
"""

from __future__ import annotations

import glob
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from embedserve.errors import InvalidInput
from embedserve.local.documents import EMPTY, NOT_JSON, NOT_OBJECT, text_problem

FORMATS = ("jsonl", "csv", "parquet", "text")
EXTENSIONS = {".jsonl": "jsonl", ".ndjson": "jsonl", ".json": "jsonl", ".csv": "csv",
              ".parquet": "parquet", ".pq": "parquet", ".txt": "text", ".text": "text"}
# Rows per record batch asked of pyarrow: large enough that per-batch overhead
# vanishes, small enough that a batch of long documents stays a few MB.
BLOCK_ROWS = 4096


@dataclass(frozen=True)
class InputSpec:
    paths: tuple[Path, ...]
    format: str
    text_field: str = "text"
    id_field: str | None = None


@dataclass
class Part:
    """Rows [first_row, first_row + len(ids)) of the input."""

    index: int
    first_row: int
    ids: list[Any]
    texts: list[str | None]          # None where the row is not a document
    problems: list[str | None]       # why, where it is not

    def __len__(self) -> int:
        return len(self.ids)


def resolve_input(source: str, format: str | None = None, text_field: str = "text",
                  id_field: str | None = None) -> InputSpec:
    """A path, directory or glob (and an optional format name) -> the files and their format."""
    path = Path(source)
    if path.is_dir():
        paths = sorted(p for p in path.iterdir() if p.is_file() and not p.name.startswith("."))
    elif path.is_file():
        paths = [path]
    else:
        paths = sorted(Path(p) for p in glob.glob(source) if Path(p).is_file())
    if not paths:
        raise InvalidInput(f"no input files at {source!r}", field="input")
    if format is None:
        found = {EXTENSIONS.get(p.suffix.lower()) for p in paths}
        if None in found or len(found) != 1:
            suffixes = ", ".join(sorted({p.suffix or "(none)" for p in paths}))
            raise InvalidInput(f"cannot tell the input format from the file names ({suffixes}); "
                               f"pass --input-format ({', '.join(FORMATS)})", field="input_format")
        format = found.pop()
    elif format not in FORMATS:
        raise InvalidInput(f"input format must be one of {', '.join(FORMATS)}, got {format!r}",
                           field="input_format")
    return InputSpec(tuple(p.resolve() for p in paths), format, text_field, id_field)  # type: ignore[arg-type]  # set above


def count_rows(spec: InputSpec) -> int | None:
    """Rows in the input if cheap to know (Parquet metadata, newline counts), else None."""
    if spec.format == "parquet":
        import pyarrow.parquet as pq

        return sum(pq.ParquetFile(p).metadata.num_rows for p in spec.paths)
    if spec.format in ("jsonl", "text"):
        return sum(_count_lines(p) for p in spec.paths)
    return None


def _count_lines(path: Path) -> int:
    count, last = 0, b"\n"
    with open(path, "rb") as f:
        while chunk := f.read(1 << 22):
            count += chunk.count(b"\n")
            last = chunk[-1:]
    return count + (last != b"\n")


def read_parts(spec: InputSpec, part_size: int) -> Iterator[Part]:
    """The input cut into parts of ``part_size`` rows (the last may be shorter)."""
    if part_size < 1:
        raise InvalidInput("part size must be >= 1", field="part_size")
    ids: list[Any] = []
    texts: list[str | None] = []
    problems: list[str | None] = []
    index = first = 0
    for block_ids, block_texts, block_problems in _read_blocks(spec):
        ids += block_ids
        texts += block_texts
        problems += block_problems
        while len(ids) >= part_size:
            yield Part(index, first, ids[:part_size], texts[:part_size], problems[:part_size])
            ids, texts, problems = ids[part_size:], texts[part_size:], problems[part_size:]
            index, first = index + 1, first + part_size
    if ids:
        yield Part(index, first, ids, texts, problems)


Block = tuple[list[Any], list[str | None], list[str | None]]


def _read_blocks(spec: InputSpec) -> Iterator[Block]:
    reader = {"jsonl": _jsonl_blocks, "csv": _csv_blocks, "parquet": _parquet_blocks,
              "text": _text_blocks}[spec.format]
    row = 0
    for path in spec.paths:
        for raw_ids, values, problems in reader(path, spec):
            n = len(values)
            if spec.id_field is None:
                base = row + (1 if spec.format == "text" else 0)
                raw_ids = list(range(base, base + n))
            else:
                problems = [p or _id_problem(i, spec.id_field) for i, p in zip(raw_ids, problems)]
                raw_ids = [None if i is None else str(i) for i in raw_ids]
            texts = [v if p is None else None for v, p in zip(values, problems)]
            row += n
            yield raw_ids, texts, problems


def _id_problem(value: Any, field: str) -> str | None:
    return f"missing field {field!r}" if value is None else None


def _with_problems(ids: list[Any], values: list[Any], field: str) -> Block:
    return ids, values, [text_problem(v, field) for v in values]


def _jsonl_blocks(path: Path, spec: InputSpec) -> Iterator[Block]:
    ids: list[Any] = []
    values: list[Any] = []
    problems: list[str | None] = []
    with open(path, "rb") as f:
        for line in f:
            record, problem = parse_json_line(line)
            if problem is None:
                value = record.get(spec.text_field)  # type: ignore[union-attr]  # no problem: a dict
                problem = text_problem(value, spec.text_field)
                ids.append(record.get(spec.id_field) if spec.id_field else None)  # type: ignore[union-attr]
            else:
                value = None
                ids.append(None)
            values.append(value)
            problems.append(problem)
            if len(values) == BLOCK_ROWS:
                yield ids, values, problems
                ids, values, problems = [], [], []
    if values:
        yield ids, values, problems


def field_names(spec: InputSpec, rows: int = 100) -> list[str]:
    """The field names of the input's first ``rows`` rows (first seen first): what a
    user who named the wrong ``--text-field`` needs to see."""
    import pyarrow.csv as pacsv
    import pyarrow.parquet as pq

    names: dict[str, None] = {}
    path = spec.paths[0]
    if spec.format == "parquet":
        return list(pq.ParquetFile(path).schema_arrow.names)
    if spec.format == "csv":
        return list(pacsv.open_csv(path).schema.names)
    if spec.format == "jsonl":
        with open(path, "rb") as f:
            for _, line in zip(range(rows), f):
                record, _problem = parse_json_line(line)
                names.update(dict.fromkeys(map(str, record or {})))
    return list(names)


def parse_json_line(line: bytes) -> tuple[dict | None, str | None]:
    if not line.strip():
        return None, EMPTY
    try:
        record = json.loads(line)
    except (ValueError, UnicodeDecodeError):
        return None, NOT_JSON
    if not isinstance(record, dict):
        return None, NOT_OBJECT
    return record, None


def _text_blocks(path: Path, spec: InputSpec) -> Iterator[Block]:
    values: list[Any] = []
    with open(path, "rb") as f:
        for line in f:
            values.append(line.rstrip(b"\n").rstrip(b"\r").decode("utf-8", errors="replace"))
            if len(values) == BLOCK_ROWS:
                yield _with_problems([None] * len(values), values, spec.text_field)
                values = []
    if values:
        yield _with_problems([None] * len(values), values, spec.text_field)


def _check_columns(path: Path, names: list[str], spec: InputSpec) -> None:
    for name in (spec.text_field, spec.id_field):
        if name is not None and name not in names:
            raise InvalidInput(f"{path}: no column {name!r}; its columns are: {', '.join(names)}",
                               field="text_field" if name == spec.text_field else "id_field")


def _csv_blocks(path: Path, spec: InputSpec) -> Iterator[Block]:
    import pyarrow as pa
    import pyarrow.csv as pacsv

    wanted = [c for c in (spec.text_field, spec.id_field) if c is not None]
    # Strings stay strings: a numeric-looking text or id is not converted.
    convert = pacsv.ConvertOptions(column_types={c: pa.string() for c in wanted})
    reader = pacsv.open_csv(path, read_options=pacsv.ReadOptions(block_size=1 << 22),
                            convert_options=convert)
    _check_columns(path, reader.schema.names, spec)
    for batch in reader:
        yield _table_block(batch, spec)


def _parquet_blocks(path: Path, spec: InputSpec) -> Iterator[Block]:
    import pyarrow.parquet as pq

    file = pq.ParquetFile(path)
    _check_columns(path, file.schema_arrow.names, spec)
    columns = [c for c in (spec.text_field, spec.id_field) if c is not None]
    for batch in file.iter_batches(batch_size=BLOCK_ROWS, columns=columns):
        yield _table_block(batch, spec)


def _table_block(batch: Any, spec: InputSpec) -> Block:
    values = batch.column(spec.text_field).to_pylist()
    ids = batch.column(spec.id_field).to_pylist() if spec.id_field else [None] * len(values)
    return _with_problems(ids, values, spec.text_field)
