"""The ``embedserve`` command: one entry point, one subcommand per tier.

Each tier registers its own subcommands through a ``register(subparsers)``
function in ``embedserve.<tier>.cli``, so tiers stay independent and this
file only dispatches. Settings are built from the parsed flags here, at the
entry point, and passed down; library code never reads argv or the
environment.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Sequence

from embedserve.launch.processes import die_with_parent

# Modules that contribute subcommands, in the order they appear in --help.
_COMMAND_MODULES = (
    "embedserve.defaults.tokenize_cli",
    "embedserve.defaults.cli",
    "embedserve.scheduler.cli",
    "embedserve.gateway.cli",
    "embedserve.launch.serve",
    "embedserve.launch.cluster",
    "embedserve.bulk.cli",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="embedserve", description=__doc__.splitlines()[0])
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in _COMMAND_MODULES:
        importlib.import_module(name).register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    die_with_parent(os.environ)   # a launcher's child: before the imports that take seconds
    parser = build_parser()
    args = parser.parse_args(argv)
    result = args.func(args)
    return int(result or 0)


if __name__ == "__main__":
    sys.exit(main())
