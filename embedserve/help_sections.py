"""The order of every command's ``--help``: what a user sets first comes first.

Each tier declares its flags where they belong (``add_engine_flags``,
``add_gateway_flags``, ...), in whatever order its code reads best; this
module then sorts a finished parser's flags into titled sections, the same
for every command: what to serve and where (model, address, replicas, key),
then the request limits and long inputs, then precision and caches, then
CUDA-only flags, then internals. A flag not named here lands in "other
options" before the CUDA and internal sections, so a new flag is shown, just
not yet placed. Knows nothing about what the flags do.
"""

from __future__ import annotations

import argparse

# (section title, flags in the order shown). Flags a command lacks are skipped.
SECTIONS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("what to serve and where", (
        "--model", "--revision", "--served-model-name", "--url", "--served-model", "--upstream", "--host",
        "--port", "--grpc-port", "--api-key", "--batch-api-key", "--replicas", "--device", "--dtype")),
    ("what to embed (embedserve embed)", (
        "--output", "--input-format", "--text-field", "--id-field", "--input-type", "--dimensions",
        "--precision", "--top-k", "--format", "--errors", "--long-inputs", "--overwrite", "--no-progress")),
    ("requests, long inputs and batching", (
        "--max-inputs", "--max-body-bytes", "--max-inflight-tokens", "--auto-truncate",
        "--chunk-overlap", "--request-timeout", "--max-batch-tokens", "--max-batch-sequences",
        "--max-queue-tokens", "--in-flight", "--part-size", "--batch-tokens", "--batch-sequences",
        "--sort-window", "--ray", "--ray-actors", "--ray-cpus-per-actor", "--drain-timeout",
        "--route-priority", "--preempt-batch-steps", "--cpu-lanes", "--interactive-window",
        "--batch-tokens-while-interactive")),
    ("precision and caches", (
        "--cache-dir", "--calibration", "--calibrate-only", "--dtype-probe-min-cosine")),
    ("other options", ()),
    ("CUDA only (ignored on CPU)", (
        "--cuda-graphs", "--cuda-attention", "--max-graphs", "--graph-memory",
        "--capture-at-start")),
    ("internals and debugging", (
        "--replica-transport", "--replica-calls", "--replica-ping", "--chunk-sequences",
        "--chunk-tokens", "--unix-socket", "--frame-port", "--metrics-port",
        "--replica-token-file", "--max-frame-connections", "--otlp-endpoint", "--log-level",
        "--debug")),
)
OTHER = "other options"


def order_help(parser: argparse.ArgumentParser) -> None:
    """Regroup ``parser``'s optional flags into ``SECTIONS`` (help and usage in that order).

    argparse has no public way to move a declared flag into a group; this uses
    its ``_action_groups`` / ``_group_actions`` / ``_actions`` lists, which have
    kept their shape since argparse joined the standard library.
    """
    by_flag = {option: action for action in parser._actions for option in action.option_strings}
    placed: set[int] = set()
    sections: list[tuple[str, list[argparse.Action]]] = []
    for title, flags in SECTIONS:
        actions = []
        for flag in flags:
            action = by_flag.get(flag)
            if action is not None and id(action) not in placed:
                actions.append(action)
                placed.add(id(action))
        sections.append((title, actions))
    help_actions = [a for a in parser._actions if isinstance(a, argparse._HelpAction)]
    placed.update(id(a) for a in help_actions)
    rest = [a for a in parser._actions if a.option_strings and id(a) not in placed]
    sections = [(title, rest if title == OTHER else actions) for title, actions in sections]

    positionals = [a for a in parser._actions if not a.option_strings]
    for group in parser._action_groups:
        group._group_actions[:] = [a for a in group._group_actions if a in help_actions
                                   or (not a.option_strings and group is parser._positionals)]
    groups = [parser._positionals, parser._optionals]
    for title, actions in sections:
        if actions:
            group = parser.add_argument_group(title)
            group._group_actions.extend(actions)
            groups.append(group)
    parser._action_groups[:] = groups
    parser._actions[:] = [*help_actions, *(a for _, actions in sections for a in actions),
                          *positionals]
    # The full usage line lists every flag (dozens of lines); the sections below show them.
    parser.usage = " ".join(["%(prog)s", *(_usage_name(a) for a in positionals), "[options]"])


def _usage_name(action: argparse.Action) -> str:
    if isinstance(action, argparse._SubParsersAction):
        return "COMMAND ..."
    name = action.metavar if isinstance(action.metavar, str) else action.dest.upper()
    if action.nargs in ("+", argparse.ONE_OR_MORE):
        return f"{name} [{name} ...]"
    if action.nargs in ("*", "?"):
        return f"[{name} ...]" if action.nargs == "*" else f"[{name}]"
    return name
