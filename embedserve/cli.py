"""The ``embedserve`` command: one entry point, one subcommand per tier.

Each tier registers its own subcommands through a ``register(subparsers)``
function in ``embedserve.<tier>.cli``, so tiers stay independent and this
file only dispatches. Settings are built from the parsed flags here, at the
entry point, and passed down; library code never reads argv or the
environment. A failure ends as one line on stderr (``exit_errors.py``);
``--debug`` or ``EMBEDSERVE_DEBUG=1`` adds its traceback, in this process and
in the processes it starts.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Sequence
from importlib import metadata

from embedserve.exit_errors import OneLineParser, run_reporting
from embedserve.help_sections import order_help
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
DEBUG_VARIABLE = "EMBEDSERVE_DEBUG"
_DEBUG_HELP = (f"on failure, print the traceback before the one error line (also "
               f"{DEBUG_VARIABLE}=1; passed on to the processes a command starts)")


def version() -> str:
    """``embedserve X.Y.Z``, from the installed package's metadata."""
    try:
        return f"embedserve {metadata.version('embedserve')}"
    except metadata.PackageNotFoundError:   # run from a checkout that was never installed
        return "embedserve (not installed: no package metadata)"


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(prog="embedserve", description="Serve embedding and reranking models, "
                           "and embed corpora in bulk. docs/cli.md: commands, errors, exit codes.")
    parser.add_argument("--version", action="version", version=version())
    parser.add_argument("--debug", action="store_true", help=_DEBUG_HELP)
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in _COMMAND_MODULES:
        importlib.import_module(name).register(subparsers)
    for command in subparsers.choices.values():
        # Also after the command (``embedserve serve --debug``); SUPPRESS: unset here
        # leaves the global flag's value alone.
        command.add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                             help=_DEBUG_HELP)
        order_help(command)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    die_with_parent(os.environ)   # a launcher's child: before the imports that take seconds
    parser = build_parser()
    args = parser.parse_args(argv)
    debug = args.debug or os.environ.get(DEBUG_VARIABLE, "") not in ("", "0")
    if debug:
        os.environ[DEBUG_VARIABLE] = "1"   # the children this command starts inherit it
    return run_reporting(args.func, args, debug)


if __name__ == "__main__":
    sys.exit(main())
