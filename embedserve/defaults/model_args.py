"""``--model`` / ``--cache-dir`` for every command that serves a model.

An entry-point helper: the one place that reads ``EMBEDSERVE_CACHE_DIR`` to pick
where the default model is built. Imports neither torch nor the engine until a
default model must actually be built, so the gateway's CLI stays light.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path


def default_cache_dir() -> Path:
    """$EMBEDSERVE_CACHE_DIR, else ~/.cache/embedserve/models."""
    configured = os.environ.get("EMBEDSERVE_CACHE_DIR")
    return Path(configured) if configured else Path.home() / ".cache" / "embedserve" / "models"


CACHE_DIR_HELP = "where the default model is built (default: $EMBEDSERVE_CACHE_DIR or ~/.cache/embedserve/models)"


def add_model_arguments(parser: argparse.ArgumentParser, model_help: str) -> None:
    """``--model`` and ``--cache-dir``, as every serving command takes them."""
    parser.add_argument("--model", type=Path, default=None, help=model_help)
    parser.add_argument("--cache-dir", type=Path, default=None, help=CACHE_DIR_HELP)


def model_dir_from_args(args: argparse.Namespace) -> Path:
    """``--model``, else the default model, built into ``--cache-dir`` on first use."""
    if args.model is not None:
        return args.model
    from embedserve.defaults.build import default_model_path, ensure_default_model, is_current_build

    cache_dir = args.cache_dir or default_cache_dir()
    if not is_current_build(default_model_path(cache_dir)):
        print("embedserve: building the default model (once, on first use) ...",
              file=sys.stderr, flush=True)
    return ensure_default_model(cache_dir)
