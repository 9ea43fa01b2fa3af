"""The priority classes' flags (docs/priority.md): parsed into settings, refused when
malformed, passed on by serve and cluster to their replicas and gateway."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from embedserve.gateway.cli import add_gateway_flags, gateway_settings
from embedserve.gateway.settings import ServedModel
from embedserve.launch import cluster, serve
from embedserve.scheduler import cli as scheduler_cli
from embedserve.scheduler.settings import (
    BATCH_TOKENS_WHILE_INTERACTIVE,
    INTERACTIVE_WINDOW_S,
    SchedulerSettings,
)


def parse(command: str, *argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    subparsers = parser.add_subparsers()
    for module in (scheduler_cli, serve, cluster):
        module.register(subparsers)
    return parser.parse_args([command, *argv])


def test_the_replica_flags_reach_its_settings():
    args = parse("scheduler", "--batch-tokens-while-interactive", "64", "--interactive-window", "0.5")
    settings = scheduler_cli.settings_from_args(args, Path("/models/m"))
    assert (settings.batch_tokens_while_interactive, settings.interactive_window_s) == (64, 0.5)
    defaults = scheduler_cli.settings_from_args(parse("scheduler"), Path("/models/m"))
    assert (defaults.batch_tokens_while_interactive, defaults.interactive_window_s) == \
        (BATCH_TOKENS_WHILE_INTERACTIVE, INTERACTIVE_WINDOW_S)


@pytest.mark.parametrize("argv", [("--batch-tokens-while-interactive", "0"),
                                  ("--interactive-window", "-1"), ("--interactive-window", "soon")])
def test_bad_replica_flags_are_refused(argv, capsys):
    with pytest.raises(SystemExit):
        parse("scheduler", *argv)
    assert argv[0] in capsys.readouterr().err


def test_bad_settings_are_refused():
    with pytest.raises(ValueError, match="batch_tokens_while_interactive"):
        SchedulerSettings(model_dir=Path("m"), batch_tokens_while_interactive=0)
    with pytest.raises(ValueError, match="interactive_window_s"):
        SchedulerSettings(model_dir=Path("m"), interactive_window_s=-0.5)


@pytest.mark.parametrize("command", ["serve", "cluster"])
def test_serve_and_cluster_pass_only_the_changed_replica_flags_on(command):
    assert scheduler_cli.priority_flags(parse(command)) == ()
    assert scheduler_cli.priority_flags(parse(command, "--batch-tokens-while-interactive", "64",
                                              "--interactive-window", "0.25")) == \
        ("--batch-tokens-while-interactive", "64", "--interactive-window", "0.25")
    assert scheduler_cli.priority_flags(parse(command, "--no-preempt-batch-steps")) == \
        ("--no-preempt-batch-steps",)
    assert scheduler_cli.priority_flags(parse(command, "--preempt-batch-steps")) == ()


def test_preemption_is_on_by_default_and_can_be_turned_off():
    assert scheduler_cli.settings_from_args(parse("scheduler"), Path("/models/m")).preempt_batch_steps
    off = scheduler_cli.settings_from_args(parse("scheduler", "--no-preempt-batch-steps"), Path("/models/m"))
    assert not off.preempt_batch_steps


def gateway_args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_gateway_flags(parser, starts_replicas=True)
    return parser.parse_args(list(argv))


def test_the_gateway_flags_reach_its_settings(monkeypatch):
    monkeypatch.delenv("EMBEDSERVE_BATCH_API_KEY", raising=False)
    args = gateway_args("--batch-api-key", "k1", "--batch-api-key", "k2",
                        "--route-priority", "/embed=Batch", "--route-priority", "/rerank=interactive")
    settings = gateway_settings(args, [ServedModel(Path("/models/m"), ("127.0.0.1:1",))])
    assert settings.batch_api_keys == ("k1", "k2")
    assert settings.route_priorities == {"/embed": "batch", "/rerank": "interactive"}
    assert "k1" not in repr(settings)


@pytest.mark.parametrize("rule", ["/embed", "embed=batch", "/embed=urgent"])
def test_a_malformed_route_rule_is_one_line_naming_it(rule):
    with pytest.raises(SystemExit, match="--route-priority"):
        gateway_settings(gateway_args("--route-priority", rule),
                         [ServedModel(Path("/models/m"), ("127.0.0.1:1",))])


def test_a_replica_on_a_unix_socket_opens_no_tcp_frame_port_unless_asked():
    """Its gateway is on the same machine and calls the frame socket beside the Unix one
    (docs/replica-link.md); a TCP frame port would only be one more door."""
    def frame_port(*argv: str) -> int | None:
        return scheduler_cli.settings_from_args(parse("scheduler", *argv), Path("/models/m")).frame_port
    assert frame_port() == 0                                   # TCP only: a free port
    assert frame_port("--unix-socket", "/run/r.sock") is None
    assert frame_port("--unix-socket", "/run/r.sock", "--frame-port", "50052") == 50052
    assert frame_port("--frame-port", "off") is None
