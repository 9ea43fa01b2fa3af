"""``embedserve embed --ray ADDRESS``: the same job on a Ray cluster.

Ray Data reads the input (``read_parquet`` / ``read_csv``; JSON Lines and
text through ``read_text`` so that a bad line is one bad row, parsed by the
same rules as the single-process reader), cuts it into blocks of exactly
``part_size`` rows in input order (``repartition(strict=True)``), and maps
each block through ``EmbedBatches`` actors (one model per actor). Each actor
batch is one part of the single-process job, packed the same way, so the
vectors match. Order is kept with ``preserve_order``; this driver streams
the results back and writes them with the single-process writer (part
files, then the output and the errors file), so the files have the same
layout. An interrupted job resumes as the single-process one does: the
driver records parts in input order, so the finished ones are always the
first K; the rerun splits them off the repartitioned dataset (their rows
are read, not embedded) and embeds the rest as parts K, K+1, ...

Differences from the single-process reader: Ray's ``read_text`` splits lines
at every Unicode line boundary (``str.splitlines``), not only at ``\\n``.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import shutil
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from embedserve.bulk import manifest as manifests
from embedserve.bulk.job import JobPaths
from embedserve.bulk.progress import ProgressBar, Totals
from embedserve.bulk.reader import InputSpec, Part, count_rows, parse_json_line
from embedserve.bulk.run import part_output, prepare_output
from embedserve.bulk.writer import assemble, write_part
from embedserve.integrations.ray import PROBLEM, EmbedBatches
from embedserve.local import columns
from embedserve.local.documents import text_problem
from embedserve.local.embedded import EmbeddedPart
from embedserve.local.options import EmbedOptions
from embedserve.model.info import read_model_info
from embedserve.model.probe_texts import DEFAULT_PROBE_MIN_COSINE
from embedserve.process_children import living_children
from embedserve.scheduler.settings import DEFAULT_DTYPE

log = logging.getLogger(__name__)

LINE = "text"  # the column ray.data.read_text produces


def parse_json_lines(batch: pa.Table, text_field: str, id_field: str | None) -> pa.Table:
    """A ``read_text`` batch of JSON Lines -> text, id and problem columns (the reader's rules)."""
    texts, ids, problems = [], [], []
    for line in batch.column(LINE).to_pylist():
        record, problem = parse_json_line(line.encode())
        value = None if record is None else record.get(text_field)
        problem = problem or text_problem(value, text_field)
        texts.append(value if problem is None else None)
        ids.append(None if record is None or id_field is None else _id_string(record.get(id_field)))
        problems.append(problem)
    out = {text_field: pa.array(texts, pa.string()), PROBLEM: pa.array(problems, pa.string())}
    if id_field is not None:
        out[id_field] = pa.array(ids, pa.string())
    return pa.table(out)


def _id_string(value: Any) -> str | None:
    return None if value is None else str(value)


def _read(ray: Any, spec: InputSpec):
    paths = [str(p) for p in spec.paths]
    if spec.format == "parquet":
        columns_ = [c for c in (spec.text_field, spec.id_field) if c is not None]
        return ray.data.read_parquet(paths, columns=columns_)
    if spec.format == "csv":
        import pyarrow.csv as pacsv

        wanted = [c for c in (spec.text_field, spec.id_field) if c is not None]
        convert = pacsv.ConvertOptions(column_types={c: pa.string() for c in wanted}, include_columns=wanted)
        return ray.data.read_csv(paths, convert_options=convert)
    lines = ray.data.read_text(paths, drop_empty_lines=False)
    if spec.format == "jsonl":
        return lines.map_batches(parse_json_lines, batch_format="pyarrow",
                                 fn_kwargs={"text_field": spec.text_field, "id_field": spec.id_field})
    return lines


def cpus_per_actor_for(address: str, actors: int, asked: float | None) -> float:
    """The CPUs each actor reserves: as asked, else on a Ray started here the machine's cores
    shared among the actors (torch in an actor runs as many threads as it reserves), else 1."""
    if asked is not None:
        return asked
    if address == "local":
        return float(max(1, (os.cpu_count() or 1) // actors))
    return 1.0


GCS_START_WAIT_VARIABLE = "RAY_gcs_server_port_wait_time_s"
LOCAL_GCS_START_WAIT_S = 120   # Ray's own default is 30 s
LOCAL_START_ATTEMPTS = 2


def start_local_ray(actors: int, cpus_per_actor: float) -> None:
    """Start a Ray cluster on this machine for ``actors`` actors of ``cpus_per_actor`` CPUs.

    Ray runs its workers at nice 15 so that its own daemons and the driver win the
    CPU. Here the actors are the job's compute and everything else only moves
    results, so they run at the default priority: at nice 15 every wake-up of a
    daemon preempted one of the actor's OpenMP threads, and the others waited for
    it (the model ran about 5 % slower on 2 cores).

    Ray gives its GCS server 30 s to publish its port and then fails the whole
    ``ray.init``. On a busy machine it once needed longer (no GCS log had even
    been written by then), and a bulk job has nothing better to do than wait,
    so a head started here gets ``LOCAL_GCS_START_WAIT_S`` unless the user set
    Ray's own variable. Its raylet then has 30 s to register with the GCS, and that
    wait has no setting: once, on two busy cores, the raylet never wrote a line of
    log in that time. A head that does not come up is stopped and started once
    more, up to ``LOCAL_START_ATTEMPTS`` in all. Ray keeps no handle on the
    processes of a head whose start failed, so the ones it started (GCS, raylet,
    monitors: children of this process) are killed here.
    """
    import ray

    for attempt in range(1, LOCAL_START_ATTEMPTS + 1):
        before = child_pids()
        try:
            with environment_default(GCS_START_WAIT_VARIABLE, str(LOCAL_GCS_START_WAIT_S)):
                ray.init(num_cpus=local_cpus(actors, cpus_per_actor), log_to_driver=False,
                         include_dashboard=False, _system_config={"worker_niceness": 0})
            return
        except Exception as error:   # Ray raises a bare Exception when its node times out
            ray.shutdown()
            kill_and_reap(child_pids() - before)
            if attempt == LOCAL_START_ATTEMPTS:
                raise
            log.warning("the local Ray head did not start (%s): starting it again", error)


def child_pids() -> set[int]:
    """This process's living children (read from Linux's /proc; elsewhere none)."""
    return living_children(os.getpid())


def kill_and_reap(pids: set[int]) -> None:
    """SIGKILL each of this process's children in ``pids`` and wait for it."""
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    for pid in pids:
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, 0)


@contextlib.contextmanager
def environment_default(name: str, value: str) -> Iterator[None]:
    """``name=value`` in this process's environment while the block runs, unless ``name``
    is already set (then it is left alone)."""
    if name in os.environ:
        yield
        return
    os.environ[name] = value
    try:
        yield
    finally:
        os.environ.pop(name, None)


def local_cpus(actors: int, cpus_per_actor: float) -> int:
    """Logical CPUs for a Ray started here: this machine's cores, and always one more than
    the actors reserve. The actors hold their CPUs for the whole job, and Ray Data's read
    and repartition tasks need one of their own, or the job waits forever."""
    return max(os.cpu_count() or 1, math.ceil(actors * cpus_per_actor) + 1)


def run_on_ray(address: str, spec: InputSpec, paths: JobPaths, model_dir: Path, options: EmbedOptions,
               part_size: int, job: dict[str, Any], actors: int = 1, device: str = "cpu",
               dtype: str | None = DEFAULT_DTYPE, probe_min_cosine: float = DEFAULT_PROBE_MIN_COSINE,
               overwrite: bool = False, show_progress: bool = True,
               cpus_per_actor: float | None = None, cache_dir: Path | None = None) -> Totals:
    """Run the job on the Ray cluster at ``address`` ("local": start one here; "auto": the
    running cluster this machine belongs to; "ray://host:10001": a remote one).
    ``cpus_per_actor``: see ``cpus_per_actor_for``."""
    import ray

    cpus_per_actor = cpus_per_actor_for(address, actors, cpus_per_actor)

    manifest = prepare_output(paths, dict(job, ray=True), overwrite)
    done = finished_prefix(manifest.parts)
    dimension = options.dimensions or read_model_info(model_dir).dimension
    started_here = not ray.is_initialized()
    if started_here:
        if address == "local":
            start_local_ray(actors, cpus_per_actor)
        else:
            ray.init(address=address, log_to_driver=False, include_dashboard=False)
    try:
        context = ray.data.DataContext.get_current()
        context.execution_options.preserve_order = True
        context.enable_progress_bars = False  # the job draws its own
        text_field = "text" if spec.format == "text" else spec.text_field
        dataset = _read(ray, spec).repartition(target_num_rows_per_block=part_size, strict=True)
        if done:
            # Parts 0..done-1 are on disk: embed from the first row of part ``done`` on.
            dataset = dataset.split_at_indices([done * part_size])[1].repartition(
                target_num_rows_per_block=part_size, strict=True)
        embedded = dataset.map_batches(
            EmbedBatches, batch_size=part_size, batch_format="pyarrow", concurrency=actors,
            num_cpus=cpus_per_actor,
            fn_constructor_kwargs=dict(model_dir=str(model_dir), text_field=text_field,
                                       id_field=spec.id_field, device=device, dtype=dtype,
                                       probe_min_cosine=probe_min_cosine,
                                       cache_dir=None if cache_dir is None else str(cache_dir),
                                       **vars(options)))
        totals = Totals()
        totals.resumed_rows = sum(manifest.parts[i].rows for i in range(done))
        index = done
        with ProgressBar(count_rows(spec), show_progress) as bar:
            bar.advance(totals.resumed_rows)
            for batch in embedded.iter_batches(batch_size=part_size, batch_format="pyarrow"):
                out = _part_output(index, batch, spec, options, part_size, dimension)
                write_part(paths, index, out.table, out.errors)
                manifest.parts[index] = out.record
                manifests.save(manifest, paths.manifest)
                totals.documents += out.record.documents
                totals.tokens += out.record.tokens
                totals.skipped.update(out.record.skipped)
                bar.advance(out.record.rows, out.record.tokens)
                index += 1
    finally:
        if started_here:
            ray.shutdown()
    for i in range(done):   # the summary counts the whole job, as the single-process one does
        totals.documents += manifest.parts[i].documents
        totals.tokens += manifest.parts[i].tokens
        totals.skipped.update(manifest.parts[i].skipped)
    assemble(paths, list(range(index)), options.precision)
    shutil.rmtree(paths.work_dir)
    return totals


def finished_prefix(parts: dict[int, Any]) -> int:
    """How many parts from the first are finished (the driver records them in order, so
    after an interruption these are all of them; any beyond a gap are redone)."""
    count = 0
    while count in parts:
        count += 1
    return count


def _part_output(index: int, batch: pa.Table, spec: InputSpec, options: EmbedOptions, part_size: int,
                 dimension: int):
    """One result batch (a part) as the single-process run's part output."""
    first_row = index * part_size
    n = batch.num_rows
    if spec.id_field is None:
        base = first_row + (1 if spec.format == "text" else 0)
        ids: list[Any] = list(range(base, base + n))
    else:
        ids = [_id_string(v) for v in batch.column(spec.id_field).to_pylist()]
    problems = batch.column(PROBLEM).to_pylist()
    valid = np.array([i for i, p in enumerate(problems) if p is None], dtype=np.int64)
    part = Part(index, first_row, ids, [None] * n, problems)
    done = batch.take(pa.array(valid))
    embedding = done.column(columns.EMBEDDING)
    stored = columns.embedding_matrix(embedding, options.precision)
    result = EmbeddedPart(np.arange(len(valid), dtype=np.int64), stored,
                          done.column(columns.TOKENS).to_numpy(), done.column(columns.TRUNCATED).to_numpy(),
                          done.column(columns.CHUNKED).to_numpy(), [])
    return part_output(part, valid, result, spec, options.precision, dimension)
