"""The bulk pipeline: read and prepare ahead, compute, write behind; resumable.

Three stages overlap: a reader thread cuts the input into parts and
prepares each (tokenization on all cores, the packing plan), the calling
thread runs the model on one part at a time, and a writer thread turns
finished parts into files and records them in the manifest. Bounded queues
(``AHEAD`` parts prepared, ``BEHIND`` parts waiting to be written) keep
memory flat however large the input. Parts already in the manifest are read
past without being prepared. Batches never cross a part, so a part's
vectors do not depend on where an earlier run stopped.

The embedder is anything with ``prepare(texts)`` and ``compute(prepared)``
returning an ``EmbeddedPart``: ``LocalEmbedder`` (this process) or
``RemoteEmbedder`` (a gateway).
"""

from __future__ import annotations

import queue
import shutil
import threading
from collections import Counter
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import pyarrow as pa

from embedserve.bulk import manifest as manifests
from embedserve.bulk.job import JobPaths
from embedserve.bulk.manifest import Manifest, PartRecord
from embedserve.bulk.progress import ProgressBar, Totals
from embedserve.bulk.reader import InputSpec, Part, count_rows, read_parts
from embedserve.bulk.writer import assemble, part_table, write_part
from embedserve.errors import InvalidInput
from embedserve.local.embedded import EmbeddedPart

AHEAD = 2    # parts prepared before the model needs them
BEHIND = 2   # finished parts waiting for the writer


class PartEmbedder(Protocol):
    @property
    def dimension(self) -> int: ...  # read-only: LocalEmbedder's is a property

    def prepare(self, texts: list[str]) -> Any: ...

    def compute(self, prepared: Any) -> EmbeddedPart: ...


@dataclass(frozen=True)
class PartOutput:
    table: pa.Table
    errors: list[dict[str, Any]]
    record: PartRecord


def reason_kind(reason: str) -> str:
    """The counted category of a skip reason ("too long: 600 tokens ..." -> "too long")."""
    return reason.split(":", 1)[0]


def id_type(spec: InputSpec) -> pa.DataType:
    return pa.int64() if spec.id_field is None else pa.string()


def part_output(part: Part, valid: np.ndarray, embedded: EmbeddedPart, spec: InputSpec,
                precision: str, dimension: int) -> PartOutput:
    """A part's output rows, its error records (in row order) and its manifest record.

    ``valid``: the part's row indices that were handed to the embedder;
    ``embedded.rows`` and its problems index into them.
    """
    rows = valid[embedded.rows]
    problems = [(i, p) for i, p in enumerate(part.problems) if p is not None]
    problems += [(int(valid[i]), reason) for i, reason in embedded.problems]
    problems.sort()
    errors = [{"row": part.first_row + i, "id": part.ids[i], "reason": reason} for i, reason in problems]
    table = part_table(part.ids, rows, embedded.stored, embedded.tokens, embedded.truncated,
                       embedded.chunked, id_type(spec), precision, dimension, embedded.sparse,
                       embedded.token_vectors)
    skipped = Counter(reason_kind(reason) for _, reason in problems)
    record = PartRecord(len(part), len(rows), int(embedded.tokens.sum()), dict(skipped))
    return PartOutput(table, errors, record)


def refuse_before_loading(spec: InputSpec, paths: JobPaths, overwrite: bool, job: dict[str, Any]) -> None:
    """The refusals that need no model, raised before one loads (a large model takes a
    while): a finished output that is not to be replaced, an unfinished job that
    ``job`` would not resume (its engine part, such as the dtype ``auto`` resolves to,
    is only known once the model has loaded: ``prepare_output`` compares it then), and
    an input known to have no rows."""
    recorded = None if overwrite else manifests.load(paths.manifest)
    if not overwrite and paths.output.exists() and recorded is None:
        raise _exists(paths)
    if recorded is not None:
        manifests.check_same_job(_but_engine(recorded.job), _but_engine(job), paths.work_dir)
    # Parquet says its row count in its footer; other inputs are only known empty when
    # their files are (counting their lines here would read the input twice).
    empty = count_rows(spec) == 0 if spec.format == "parquet" else all(p.stat().st_size == 0 for p in spec.paths)
    if empty:
        raise _no_rows(spec)


def _but_engine(job: dict[str, Any]) -> dict[str, Any]:
    return {key: value for key, value in job.items() if key != "engine"}


def _exists(paths: JobPaths) -> InvalidInput:
    return InvalidInput(f"{paths.output} already exists; pass --overwrite to replace it")


def _no_rows(spec: InputSpec) -> InvalidInput:
    return InvalidInput(f"the input has no rows: {', '.join(map(str, spec.paths))}", field="input")


def prepare_output(paths: JobPaths, job: dict[str, Any], overwrite: bool) -> Manifest:
    """The manifest to continue (same job) or a fresh one; refuses to clobber without ``overwrite``."""
    if overwrite:
        shutil.rmtree(paths.work_dir, ignore_errors=True)
        for path in (paths.output, paths.errors, *([paths.ids] if paths.format == "npy" else [])):
            path.unlink(missing_ok=True)
    recorded = manifests.load(paths.manifest)
    if recorded is not None:
        manifests.check_same_job(recorded.job, job, paths.work_dir)
        return recorded
    if paths.output.exists():
        raise _exists(paths)
    paths.work_dir.mkdir(parents=True, exist_ok=True)
    fresh = Manifest(job)
    manifests.save(fresh, paths.manifest)
    return fresh


def run_job(spec: InputSpec, paths: JobPaths, embedder: PartEmbedder, job: dict[str, Any],
            part_size: int, precision: str, overwrite: bool = False,
            show_progress: bool = True) -> Totals:
    """Embed the input into ``paths.output``; resumes a job interrupted earlier."""
    manifest = prepare_output(paths, job, overwrite)
    totals = Totals()
    with ProgressBar(count_rows(spec), show_progress) as bar, \
            ThreadPoolExecutor(1, thread_name_prefix="bulk-writer") as writer:
        pending: list[Future] = []
        part_count = 0
        for part, valid, prepared in _prepared_parts(spec, part_size, manifest, embedder):
            part_count = part.index + 1
            if prepared is None:
                totals.resumed_rows += len(part)
                bar.advance(len(part))
                continue
            embedded = embedder.compute(prepared)
            pending.append(writer.submit(_write, paths, manifest, part, valid, embedded, spec,
                                         precision, embedder.dimension))
            bar.advance(len(part), int(embedded.tokens.sum()))
            while len(pending) > BEHIND:
                pending.pop(0).result()
        for future in pending:
            future.result()
    if part_count == 0:
        shutil.rmtree(paths.work_dir)
        raise _no_rows(spec)
    for index in range(part_count):
        record = manifest.parts[index]
        totals.documents += record.documents
        totals.tokens += record.tokens
        totals.skipped.update(record.skipped)
    assemble(paths, list(range(part_count)), precision)
    shutil.rmtree(paths.work_dir)
    return totals


def _write(paths: JobPaths, manifest: Manifest, part: Part, valid: np.ndarray, embedded: EmbeddedPart,
           spec: InputSpec, precision: str, dimension: int) -> None:
    """Writer thread: the part's files, then its manifest record (the only writer of both)."""
    out = part_output(part, valid, embedded, spec, precision, dimension)
    write_part(paths, part.index, out.table, out.errors)
    manifest.parts[part.index] = out.record
    manifests.save(manifest, paths.manifest)


_DONE = object()


def _prepared_parts(spec: InputSpec, part_size: int, manifest: Manifest, embedder: PartEmbedder):
    """(part, valid rows, prepared or None when already finished), prepared on a reader thread.

    The reader thread always ends by handing over one terminal item (``_DONE``
    or its exception); a consumer that stops early sets ``stop`` and drains to
    that item, so the thread never stays blocked on a full queue.
    """
    finished = set(manifest.parts)
    handoff: queue.Queue = queue.Queue(maxsize=AHEAD)
    stop = threading.Event()

    def produce() -> None:
        try:
            for part in read_parts(spec, part_size):
                if stop.is_set():
                    break
                if part.index in finished:
                    handoff.put((part, None, None))
                    continue
                valid = np.array([i for i, t in enumerate(part.texts) if t is not None], dtype=np.int64)
                handoff.put((part, valid, embedder.prepare([part.texts[i] for i in valid.tolist()])))
            handoff.put(_DONE)
        except BaseException as exc:  # handed to the consumer, which raises it
            handoff.put(exc)

    thread = threading.Thread(target=produce, name="bulk-reader", daemon=True)
    thread.start()
    terminal = False
    try:
        while True:
            item = handoff.get()
            if item is _DONE or isinstance(item, BaseException):
                terminal = True
                if item is _DONE:
                    return
                raise item  # type: ignore[misc]  # a BaseException: not _DONE
            yield item
    finally:
        stop.set()
        while not terminal:
            item = handoff.get()
            terminal = item is _DONE or isinstance(item, BaseException)
        thread.join()
