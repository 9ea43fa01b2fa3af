"""deploy/Dockerfile: hadolint-clean (and hadolint catches a broken copy), and its shape.

The image itself cannot be built here (no Docker engine); what the issue asks
of it is checked on the file: dependency layer before the source, non-root
user, the default model built at build time, a HEALTHCHECK, one build
argument for CPU/CUDA, a build context without the virtualenv.
"""

from __future__ import annotations

from pathlib import Path

from deploy_validators import DEPLOY, DOCKERFILE, hadolint, instructions
from deploy_validators import deploy_copy  # noqa: F401 (a fixture)


def test_dockerfile_passes_hadolint() -> None:
    result = hadolint(DOCKERFILE)
    assert result.returncode == 0, result.stdout + result.stderr


def test_hadolint_rejects_a_broken_dockerfile(deploy_copy: Path) -> None:
    dockerfile = deploy_copy / "Dockerfile"
    text = dockerfile.read_text()
    text = text.replace("ARG PYTHON_IMAGE=python:3.11-slim-bookworm", "ARG PYTHON_IMAGE=python")
    dockerfile.write_text(text.replace("USER 10001:10001", "RUN cd /tmp && apt-get install curl"))
    result = hadolint(dockerfile)
    assert result.returncode != 0
    assert "DL3003" in result.stdout  # cd instead of WORKDIR
    assert "DL3008" in result.stdout or "DL3015" in result.stdout  # unpinned apt, recommends


def test_dockerfile_shape() -> None:
    steps = instructions(DOCKERFILE.read_text())
    kinds = [kind for kind, _ in steps]
    copies = [rest for kind, rest in steps if kind == "COPY"]
    # Dependencies are installed from pyproject.toml before any source is copied.
    assert copies[0] == "pyproject.toml ./"
    first_pip = next(i for i, (k, rest) in enumerate(steps) if k == "RUN" and "pip install" in rest)
    first_source = next(i for i, (k, rest) in enumerate(steps) if k == "COPY" and "embedserve" in rest)
    assert first_pip < first_source
    # Runs as a non-root user, and the model is built as that user.
    users = [rest for kind, rest in steps if kind == "USER"]
    assert users and not users[-1].startswith(("root", "0"))
    build_model = next(i for i, (k, rest) in enumerate(steps) if k == "RUN" and "build-default" in rest)
    assert kinds.index("USER") < build_model
    assert kinds.count("HEALTHCHECK") == 1
    # CPU and CUDA come from one build argument selecting the torch wheel index.
    assert any(kind == "ARG" and rest.startswith("TORCH_VARIANT=cpu") for kind, rest in steps)


def test_build_context_leaves_out_the_environment_and_caches() -> None:
    # The context is the repository root: without these the build would upload
    # the virtualenv and model caches (gigabytes) on every build.
    ignored = set((DEPLOY / "Dockerfile.dockerignore").read_text().split())
    assert {".git", ".venv", ".cache", "**/__pycache__"} <= ignored
    copied = {rest.split()[0] for kind, rest in instructions(DOCKERFILE.read_text()) if kind == "COPY"}
    assert not copied & ignored
