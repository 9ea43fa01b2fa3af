"""The command lines written into deploy/ are ones the real CLI accepts.

A compose file or manifest can validate and still start a container that
exits at once on an unknown flag. Each command here is parsed by
``embedserve.cli.build_parser()`` (Kubernetes ``$(VAR)`` references are first
expanded from the ConfigMap, as the kubelet does), and the Dockerfile's
``build-default`` step is run to check it prints exactly the directory the
image links as /models/default.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from embedserve.cli import build_parser

ROOT = Path(__file__).resolve().parent.parent
DEPLOY = ROOT / "deploy"


def _compose_commands() -> list[tuple[str, list[str]]]:
    commands = []
    for name in ("docker-compose.yml", "docker-compose.gpu.yml"):
        for service, spec in yaml.safe_load((DEPLOY / name).read_text())["services"].items():
            if "command" in spec and service != "prometheus":
                commands.append((f"{name}:{service}", [str(a) for a in spec["command"]]))
    return commands


def _k8s_commands() -> list[tuple[str, list[str]]]:
    documents = [d for p in sorted((DEPLOY / "k8s").glob("*.yaml"))
                 for d in yaml.safe_load_all(p.read_text()) if d]
    config = next(d["data"] for d in documents if d["kind"] == "ConfigMap")
    commands = []
    for document in documents:
        if document["kind"] != "Deployment":
            continue
        pod = document["spec"]["template"]["spec"]
        for container in [*pod.get("initContainers", []), *pod["containers"]]:
            args = [re.sub(r"\$\((\w+)\)", lambda m: config[m.group(1)], a) for a in container["args"]]
            commands.append((f"k8s:{document['metadata']['name']}:{container['name']}", args))
    return commands


def _dockerfile_cmd() -> list[str]:
    line = next(s for s in (DEPLOY / "Dockerfile").read_text().splitlines() if s.startswith("CMD "))
    return yaml.safe_load(line[len("CMD "):])  # a JSON array is YAML too


ALL_COMMANDS = _compose_commands() + _k8s_commands() + [("Dockerfile:CMD", _dockerfile_cmd())]


@pytest.mark.parametrize("where, argv", ALL_COMMANDS, ids=[w for w, _ in ALL_COMMANDS])
def test_deploy_command_parses_with_the_real_cli(where: str, argv: list[str]) -> None:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # argparse reports an unknown flag by exiting 2
        pytest.fail(f"{where}: `embedserve {' '.join(argv)}` is rejected by the CLI (exit {exc.code})")
    assert args.command == argv[0]
    assert callable(args.func)


def test_every_tier_is_deployed() -> None:
    roles = {argv[0] for _, argv in ALL_COMMANDS}
    assert {"scheduler", "gateway", "serve"} <= roles


def test_build_default_prints_only_the_model_directory(default_model_dir: Path) -> None:
    # The Dockerfile runs `ln -s "$(embedserve model build-default --cache-dir /models)"
    # /models/default`: stdout must be exactly the model directory.
    result = subprocess.run([sys.executable, "-m", "embedserve.cli", "model", "build-default",
                             "--cache-dir", str(default_model_dir.parent)],
                            capture_output=True, text=True, timeout=300, check=True)
    assert result.stdout.splitlines() == [str(default_model_dir)]
    assert (Path(result.stdout.strip()) / "config.json").exists()
