"""Every command's ``--help`` shows what a user sets first, first; every flag still parses."""

from __future__ import annotations

import argparse
import re

import pytest

from embedserve.cli import build_parser
from embedserve.help_sections import OTHER, SECTIONS

_ENTRY = re.compile(r"^  (?:-\w(?: \S+)?, )?(--[\w-]+)")
ORDER = [title for title, _ in SECTIONS]


def commands() -> dict[str, argparse.ArgumentParser]:
    parser = build_parser()
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(action.choices)


def listed(help_text: str) -> list[tuple[str, str]]:
    """(section title, flag) for each flag the help lists, in order."""
    section, found = "", []
    for line in help_text.splitlines():
        if line.endswith(":") and not line.startswith(" "):
            section = line[:-1]
        elif match := _ENTRY.match(line):
            found.append((section, match.group(1)))
    return found


@pytest.mark.parametrize("name", ["serve", "gateway", "scheduler", "cluster", "embed"])
def test_help_lists_sections_in_order_and_every_flag_once(name: str) -> None:
    command = commands()[name]
    flags = listed(command.format_help())
    declared = sorted(next(o for o in a.option_strings if o.startswith("--"))
                      for a in command._actions if a.option_strings)
    assert sorted(flag for _, flag in flags) == declared
    sections = [s for s, _ in flags if s in ORDER]
    assert sections == sorted(sections, key=ORDER.index)
    section_of = {flag: section for section, flag in flags}
    assert section_of["--model"] == ORDER[0]
    for flag in ("--cuda-graphs", "--cuda-attention", "--capture-at-start"):
        if flag in section_of:
            assert section_of[flag] == "CUDA only (ignored on CPU)"


def test_serve_help_is_ordered_and_every_flag_is_kept() -> None:
    serve = commands()["serve"]
    flags = [flag for _, flag in listed(serve.format_help())]
    positions = [flags.index(flag) for flag in ("--model", "--host", "--port", "--api-key",
                                                "--replicas", "--max-inputs", "--cuda-graphs",
                                                "--replica-calls")]
    assert positions == sorted(positions)
    assert OTHER not in {section for section, _ in listed(serve.format_help())}
    args = serve.parse_args(["--model", "m", "--port", "0", "--no-cuda-graphs", "--cuda-attention",
                             "padded", "--replica-calls", "grpc", "--auto-truncate", "--debug"])
    assert (args.port, args.cuda_graphs, args.cuda_attention, args.replica_calls,
            args.auto_truncate, args.debug) == (0, False, "padded", "grpc", "right", True)
