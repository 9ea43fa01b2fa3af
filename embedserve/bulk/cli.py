"""``embedserve embed INPUT -o OUTPUT``: the bulk command's flags and dispatch.

Builds the job from flags (the input spec, the embedding options, the
paths) and hands it to ``run.run_job`` with an in-process ``LocalEmbedder``,
a ``RemoteEmbedder`` (``--url``) or to ``ray_job.run_on_ray`` (``--ray``).
A job error (bad flag value, a different job in the way) is one line on
stderr and exit status 2; bad rows are not errors (they go to the errors file).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from embedserve.defaults.model_args import add_model_arguments, default_cache_dir, model_dir_from_args
from embedserve.entrypoint import error_line

if TYPE_CHECKING:
    from embedserve.bulk.job import JobPaths
    from embedserve.bulk.progress import Totals
    from embedserve.bulk.reader import InputSpec
    from embedserve.bulk.remote import RemoteEmbedder
    from embedserve.local.embedder import LocalEmbedder
    from embedserve.local.options import EmbedOptions

DEFAULT_PART_SIZE = 10_000


def register(subparsers: argparse._SubParsersAction) -> None:
    from embedserve.bulk.job import OUTPUT_FORMATS
    from embedserve.bulk.reader import FORMATS
    from embedserve.local.options import LONG_INPUT_POLICIES
    from embedserve.local.precision import PRECISIONS
    from embedserve.scheduler.cli import add_dtype_flags

    p = subparsers.add_parser("embed", help="embed a corpus of files into Parquet or .npy (resumable)",
                              description=__doc__.splitlines()[0])
    p.add_argument("input", help="a file, a directory or a glob (JSON Lines, CSV, Parquet or text)")
    p.add_argument("-o", "--output", type=Path, required=True, help="the output file (.parquet or .npy)")
    add_model_arguments(p, "model directory (default: multilingual-e5-small, built on first use)")
    p.add_argument("--input-format", choices=FORMATS, default=None,
                   help="the input's format (default: from the file extensions)")
    p.add_argument("--text-field", default="text", help="the field (column) holding the text (default: text)")
    p.add_argument("--id-field", default=None,
                   help="the field holding each row's id, kept as a string (default: the row number; "
                        "for text, the line number)")
    p.add_argument("--input-type", default=None,
                   help="the model's prompt to prepend (e5: passage or query; default: the model's default)")
    p.add_argument("--dimensions", type=int, default=None, help="Matryoshka: keep the first N dimensions")
    p.add_argument("--precision", choices=PRECISIONS, default="float32", help="stored precision (default: float32)")
    p.add_argument("--top-k", type=int, default=None,
                   help="a sparse (SPLADE) model: keep each document's top K weights (default: all "
                        "nonzeros); its output has indices and values list columns (docs/tasks.md)")
    add_dtype_flags(p)
    p.add_argument("--device", default="cpu", help="cpu or cuda[:N] (default: cpu)")
    p.add_argument("--format", choices=OUTPUT_FORMATS, default=None,
                   help="output format (default: npy for a .npy output, else parquet)")
    p.add_argument("--errors", type=Path, default=None,
                   help="the errors file, JSON Lines of row, id, reason (default: OUTPUT.errors.jsonl)")
    p.add_argument("--long-inputs", choices=LONG_INPUT_POLICIES, default="refuse",
                   help="documents longer than the model's limit: skip them (listed in the errors "
                        "file), cut them from the right, or chunk: embed windows of the model's "
                        "length and mean-pool them, weighted by their tokens (default: refuse)")
    p.add_argument("--chunk-overlap", type=int, default=0,
                   help="--long-inputs chunk: tokens consecutive windows share (default: 0)")
    p.add_argument("--part-size", type=int, default=DEFAULT_PART_SIZE,
                   help="rows per part, the unit that is written and resumed (default: %(default)s)")
    p.add_argument("--batch-tokens", type=int, default=None,
                   help="tokens per engine step (default: 4096 on CPU, the scheduler's 512 on CUDA)")
    p.add_argument("--batch-sequences", type=int, default=256, help="sequences per engine step (default: 256)")
    p.add_argument("--sort-window", type=int, default=None,
                   help="documents sorted by length together (default: the whole part)")
    p.add_argument("--overwrite", action="store_true",
                   help="start over, replacing an existing output and its unfinished job")
    p.add_argument("--no-progress", action="store_true", help="no progress bar (the summary is still printed)")
    p.add_argument("--url", default=None,
                   help="send the job through a running gateway (http://host:port) instead of "
                        "loading the model here; without --model the gateway also counts the "
                        "tokens (/tokenize) and no model is needed here")
    p.add_argument("--served-model", default=None, metavar="NAME",
                   help="--url: which of the gateway's models embeds (a name GET /v1/models lists; "
                        "needed when it serves several; default: its only model)")
    p.add_argument("--api-key", default=None,
                   help="--url: the gateway's API key (default: $EMBEDSERVE_API_KEY)")
    p.add_argument("--ray", default=None, metavar="ADDRESS",
                   help="run on a Ray cluster: local, auto or ray://host:port")
    p.add_argument("--ray-actors", type=int, default=1, help="--ray: model copies (actors) (default: 1)")
    p.add_argument("--ray-cpus-per-actor", type=float, default=None,
                   help="--ray: CPUs Ray reserves per actor, the threads torch uses in it (default: "
                        "with --ray local, this machine's cores shared among the actors; else 1)")
    p.set_defaults(func=run_command)


def run_command(args: argparse.Namespace) -> int:
    """The job; its errors (bad flags, a different job in the way, a job in which no row
    could be embedded) leave as ``EmbedServeError`` for the entry point's one line."""
    totals, spec, paths = _run(args)
    if totals.documents == 0 and totals.resumed_rows == 0 and totals.skipped:
        message, status = nothing_embedded(totals, spec, paths)
        print(error_line(message), file=sys.stderr, flush=True)
        return status
    print(totals.summary(), file=sys.stderr, flush=True)
    return 0


def nothing_embedded(totals: Totals, spec: InputSpec, paths: JobPaths) -> tuple[str, int]:
    """What a job that finished with every row skipped says (the likely cause), and its
    exit status: 2 when it is the flags' fault, else 1.

    Every row lacking the text field is the wrong ``--text-field``: the message lists
    the fields the rows have; every row too long is ``--long-inputs``. The empty output
    is removed (a rerun with the right flag needs no --overwrite); the errors file
    stays, with each row's reason.
    """
    from embedserve.bulk.reader import field_names
    from embedserve.local.documents import MISSING, TOO_LONG

    for path in (paths.output, *([paths.ids] if paths.format == "npy" else [])):
        path.unlink(missing_ok=True)
    skipped = sum(totals.skipped.values())
    reasons = ", ".join(f"{n} {reason}" for reason, n in sorted(totals.skipped.items()))
    if all(reason.startswith(MISSING) for reason in totals.skipped):   # "missing field 'text'"
        seen = field_names(spec)
        message = (f"none of the {skipped} rows has the field {spec.text_field!r} (the rows' "
                   f"fields: {', '.join(seen) or 'none'}); name the text's field with --text-field")
        return message, 2
    if set(totals.skipped) == {TOO_LONG}:
        message = (f"every row is longer than the model takes ({skipped} rows); pass --long-inputs "
                   "truncate or chunk to embed them")
        return message, 2
    return (f"no row could be embedded ({reasons}); each row's reason is in {paths.errors}", 1)


def _run(args: argparse.Namespace) -> tuple[Totals, InputSpec, JobPaths]:
    from embedserve.bulk.job import job_paths
    from embedserve.bulk.job_lock import output_lock
    from embedserve.bulk.reader import resolve_input
    from embedserve.errors import InvalidInput
    from embedserve.local.options import EmbedOptions, bulk_token_budget

    if args.url and args.ray:
        raise InvalidInput("--url and --ray are two ways to run the job; pick one")
    spec = resolve_input(args.input, args.input_format, args.text_field, args.id_field)
    options = EmbedOptions(input_type=args.input_type, dimensions=args.dimensions,
                           precision=args.precision, long_inputs=args.long_inputs,
                           chunk_overlap=args.chunk_overlap,
                           token_budget=args.batch_tokens or bulk_token_budget(args.device),
                           max_sequences=args.batch_sequences,
                           window=args.sort_window or args.part_size, top_k=args.top_k)
    output_format = args.format or ("npy" if args.output.suffix == ".npy" else "parquet")
    paths = job_paths(args.output, args.errors, output_format)
    with output_lock(paths.lock):
        return _run_locked(args, spec, options, paths, output_format)


def _run_locked(args: argparse.Namespace, spec: InputSpec, options: EmbedOptions, paths: JobPaths,
                output_format: str) -> tuple[Totals, InputSpec, JobPaths]:
    from embedserve.bulk.job import job_parameters, model_fingerprint
    from embedserve.bulk.run import refuse_before_loading, run_job

    # --url without --model: the gateway tokenizes, no model is needed (or built) here.
    model_dir = None if args.url and args.model is None else model_dir_from_args(args)
    model = (f"{args.url}#{args.served_model or ''}" if model_dir is None
             else f"{model_dir.resolve()}@{model_fingerprint(model_dir)}")
    asked = job_parameters(spec, model, options, args.part_size, output_format, engine={})
    if args.ray:
        asked["ray"] = True   # as run_on_ray records it: a Ray job resumes only on Ray
    refuse_before_loading(spec, paths, args.overwrite, asked)
    if model_dir is not None:
        _check_sparse_job(model_dir, args, output_format)
    if args.ray:
        from embedserve.bulk.ray_job import run_on_ray

        # Each actor resolves auto on its own node: the job records what was asked.
        engine = {"device": args.device, "dtype": args.dtype,
                  "dtype_probe_min_cosine": args.dtype_probe_min_cosine}
        job = job_parameters(spec, model, options, args.part_size, output_format, engine)
        assert model_dir is not None
        totals = run_on_ray(args.ray, spec, paths, model_dir, options, args.part_size, job,
                            actors=args.ray_actors, cpus_per_actor=args.ray_cpus_per_actor,
                            device=args.device, dtype=args.dtype,
                            probe_min_cosine=args.dtype_probe_min_cosine,
                            overwrite=args.overwrite, show_progress=not args.no_progress,
                            cache_dir=args.cache_dir or default_cache_dir())
        return totals, spec, paths
    embedder: RemoteEmbedder | LocalEmbedder
    if args.url:
        from embedserve.bulk.remote import RemoteEmbedder

        embedder = RemoteEmbedder(args.url, model_dir, options, served_model=args.served_model,
                                  api_key=args.api_key or os.environ.get("EMBEDSERVE_API_KEY") or None)
        engine = {"url": args.url, **({"served_model": args.served_model} if args.served_model else {})}
        if model_dir is None:   # the job is the gateway's model: resuming against another is refused
            engine["model_id"] = embedder.model_id
    else:
        from embedserve.local.embedder import LocalEmbedder

        embedder = LocalEmbedder(model_dir, options, device=args.device, dtype=args.dtype,  # type: ignore[arg-type]
                                 probe_min_cosine=args.dtype_probe_min_cosine,
                                 cache_dir=args.cache_dir or default_cache_dir())
        # The dtype auto resolved to: a resume on a machine that resolves differently
        # would mix vectors of two precisions, so it counts as a different job.
        engine = {"device": args.device, "dtype": embedder.info.dtype}
    try:
        job = job_parameters(spec, model, options, args.part_size, output_format, engine)
        totals = run_job(spec, paths, embedder, job, args.part_size, options.precision,
                         overwrite=args.overwrite, show_progress=not args.no_progress)
    finally:
        embedder.close()
    return totals, spec, paths


def _check_sparse_job(model_dir: Path, args: argparse.Namespace, output_format: str) -> None:
    """A sparse or multi-vector model's job runs here (not --url, not --ray) into Parquet
    list columns."""
    from embedserve.errors import InvalidInput
    from embedserve.model.info import read_model_info

    task = read_model_info(model_dir).task
    if task not in ("sparse", "multivector"):
        return
    kind = "sparse" if task == "sparse" else "multi-vector"
    if args.url or args.ray:
        raise InvalidInput(f"a {kind} model's job runs in this process; drop --url and --ray")
    if output_format != "parquet":
        columns = "(indices, values)" if task == "sparse" else "(embedding: a list of token vectors per row)"
        raise InvalidInput(f"a {kind} model's vectors are written as Parquet list columns "
                           f"{columns}; use a .parquet output")
