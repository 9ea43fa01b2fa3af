"""deploy/Dockerfile and deploy/prometheus.Dockerfile: hadolint-clean (and
hadolint catches a broken copy), and their shape.

Building the image needs a Docker engine (scripts/compose-smoke.sh does it);
what the issue asks of the file is checked here without one: dependency
layer before the source, non-root user, the default model built at build
time, a HEALTHCHECK, one build argument for CPU/CUDA, package sources as
build arguments and the CA as a build secret (so it builds without the
public internet), no `# syntax` line (it needs Docker Hub), a root build
context without the virtualenv, and the native CPU kernels: a stage with a
C compiler builds the wheel and fails without them, the runtime stage
installs that wheel and no compiler.
"""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

from deploy_validators import (
    DOCKERFILE,
    DOCKERIGNORE,
    PROMETHEUS_DOCKERFILE,
    deploy_copy,  # noqa: F401 (a fixture)
    hadolint,
    instructions,
)


@pytest.mark.parametrize("dockerfile", [DOCKERFILE, PROMETHEUS_DOCKERFILE], ids=lambda path: path.name)
def test_dockerfiles_pass_hadolint(dockerfile: Path) -> None:
    result = hadolint(dockerfile)
    assert result.returncode == 0, result.stdout + result.stderr


def test_hadolint_rejects_a_broken_dockerfile(deploy_copy: Path) -> None:  # noqa: F811 (the imported fixture)
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
    # the virtualenv and model caches (gigabytes) on every build. The list is
    # the root .dockerignore, the only one the legacy builder reads; a second
    # list next to the Dockerfile (which BuildKit would prefer) could drift.
    ignored = {line for line in DOCKERIGNORE.read_text().split() if not line.startswith("#")}
    assert {".git", ".venv", ".cache", "**/__pycache__", "tests"} <= ignored
    assert not DOCKERFILE.with_name("Dockerfile.dockerignore").exists()
    copied = {rest.split()[0] for kind, rest in instructions(DOCKERFILE.read_text()) if kind == "COPY"}
    assert not copied & ignored


def test_no_syntax_directive_that_needs_docker_hub() -> None:
    # `# syntax=docker/dockerfile:1` makes every BuildKit build resolve
    # docker.io/docker/dockerfile first; offline that fails before step one.
    for dockerfile in (DOCKERFILE, PROMETHEUS_DOCKERFILE):
        first_lines = dockerfile.read_text().splitlines()[:5]
        assert not any(line.replace(" ", "").lower().startswith("#syntax=") for line in first_lines)


def _args(steps: list[tuple[str, str]]) -> dict[str, str | None]:
    """ARG name -> default (None when declared without one)."""
    declared = [rest.split("=", 1) for kind, rest in steps if kind == "ARG"]
    return {parts[0]: parts[1] if len(parts) == 2 else None for parts in declared}


def test_package_sources_are_build_arguments() -> None:
    steps = instructions(DOCKERFILE.read_text())
    args = _args(steps)
    assert args["PYTHON_IMAGE"] == "python:3.11-slim-bookworm"
    assert {"TORCH_INDEX_URL", "PIP_INDEX_URL", "PIP_EXTRA_INDEX_URL", "PIP_TRUSTED_HOST"} <= set(args)
    assert not any("download.pytorch.org" in (value or "") for value in args.values()), \
        "the torch index is chosen in the RUN step, so an empty TORCH_INDEX_URL still follows TORCH_VARIANT"
    install = next(rest for kind, rest in steps if kind == "RUN" and "torch==" in rest)
    torch_step = next(part for part in install.split("&&") if "torch==" in part)
    # torch alone, from its own index only: a same-version torch on an extra
    # index (PyPI's CUDA build) can never be picked, and its dependencies
    # come from the main index in the next command.
    assert '--index-url "${TORCH_INDEX_URL:-https://download.pytorch.org/whl/${TORCH_VARIANT}}"' in torch_step
    assert "--no-deps" in torch_step and "env -u PIP_EXTRA_INDEX_URL" in torch_step


def test_private_ca_is_an_optional_build_secret() -> None:
    steps = instructions(DOCKERFILE.read_text())
    networked = [rest for kind, rest in steps
                 if kind == "RUN" and ("pip install" in rest or "pip wheel" in rest) and "--no-index" not in rest]
    assert len(networked) == 1, "one step reaches the network; the source is built and installed offline"
    step = networked[0]
    assert step.startswith("--mount=type=secret,id=pip_ca,target=/run/secrets/pip_ca ")
    # Used only when given and non-empty, so a build without the secret works.
    assert "if [ -s /run/secrets/pip_ca ]; then export PIP_CERT=/run/secrets/pip_ca; fi" in step
    assert not any("CERT" in rest or "pip_ca" in rest for kind, rest in steps if kind in ("ARG", "ENV"))
    # The project's build backend comes with the dependencies, for the offline source build.
    assert "build-system" in step
    source_build = next(rest for kind, rest in steps if kind == "RUN" and "pip wheel" in rest)
    assert "--no-index" in source_build and "--no-build-isolation" in source_build


def test_tokenizer_warm_up_compiles_the_installed_package() -> None:
    # `python -c` imports from the working directory first; a warm-up run in
    # the directory the source was copied to compiles and caches that copy
    # (Numba keys its cache by source path), and every container then
    # compiles the installed package again at start-up.
    workdir, source_dir, warm_up_dir = "/", None, None
    for kind, rest in instructions(DOCKERFILE.read_text()):
        if kind == "FROM":
            workdir = "/"
        elif kind == "WORKDIR":
            workdir = rest
        elif kind == "COPY" and rest.split()[0] == "embedserve":
            source_dir = workdir
        elif kind == "RUN" and "embedserve.tokenizer.warm import load_warm" in rest:
            warm_up_dir = workdir
    assert source_dir is not None and warm_up_dir is not None
    assert warm_up_dir != source_dir


def _stages(steps: list[tuple[str, str]]) -> dict[str, tuple[str, list[tuple[str, str]]]]:
    """Stage name -> (the image or stage it is FROM, its instructions)."""
    stages: dict[str, tuple[str, list[tuple[str, str]]]] = {}
    for kind, rest in steps:
        if kind == "FROM":
            base, _, name = rest.split()
            current: list[tuple[str, str]] = []
            stages[name] = (base, current)
        elif stages:
            current.append((kind, rest))
    return stages


def _native_kernels() -> list[str]:
    """The optional ext-modules pyproject.toml declares, by module name."""
    pyproject = tomllib.loads((DOCKERFILE.parents[1] / "pyproject.toml").read_text())
    modules = pyproject["tool"]["setuptools"]["ext-modules"]
    assert all(module.get("optional") for module in modules)
    return [module["name"] for module in modules]


def _wheel_check(run: str) -> str:
    """The `python -c` program in the wheel-building step."""
    match = re.search(r'python -c "([^"]+)"', run)
    assert match, run
    return match.group(1)


def test_native_kernels_are_built_by_a_compiler_stage_and_checked() -> None:
    # The kernels are `optional` extensions: without a compiler pip skips them
    # with a warning, so the stage that builds the wheel brings gcc and the
    # build fails if any is missing from the wheel.
    stages = _stages(instructions(DOCKERFILE.read_text()))
    build = [name for name, (_, steps) in stages.items()
             if any(kind == "RUN" and "pip wheel" in rest for kind, rest in steps)]
    assert len(build) == 1
    base, steps = stages[build[0]]
    assert base == "deps"
    runs = [rest for kind, rest in steps if kind == "RUN"]
    apt = next(rest for rest in runs if "apt-get install" in rest)
    installs = [part for part in apt.split("&&") if "apt-get install" in part]
    assert any(" gcc " in f"{part} " for part in installs)
    assert all("--no-install-recommends" in part for part in installs)
    assert apt.rstrip().endswith("rm -rf /var/lib/apt/lists/*")
    wheel = next(rest for rest in runs if "pip wheel" in rest)
    assert runs.index(apt) < runs.index(wheel)
    assert "--wheel-dir /wheels" in wheel
    check = _wheel_check(wheel)
    for name in _native_kernels():
        assert name.rsplit(".", 1)[1] in check


@pytest.mark.parametrize("present", [(True,) * 7, (True, False, True, True, True, True, True),
                                     (True,) * 6 + (False,), (False,) * 7],
                         ids=["all", "one-missing", "last-missing", "none"])
def test_wheel_check_fails_without_a_kernel(tmp_path: Path, present: tuple[bool, ...]) -> None:
    # The check itself, run on a wheel with and without the kernels' shared objects.
    steps = instructions(DOCKERFILE.read_text())
    check = _wheel_check(next(rest for kind, rest in steps if kind == "RUN" and "pip wheel" in rest))
    kernels = _native_kernels()
    assert len(kernels) == len(present)
    with zipfile.ZipFile(tmp_path / "embedserve-0.1.0-cp311-cp311-linux_x86_64.whl", "w") as wheel:
        wheel.writestr("embedserve/engine/__init__.py", "")
        wheel.writestr("embedserve/engine/csrc/bf16_attention.c", "")
        for name, built in zip(kernels, present):
            if built:
                wheel.writestr(name.replace(".", "/") + ".cpython-311-x86_64-linux-gnu.so", b"")
    result = subprocess.run([sys.executable, "-c", check.replace("/wheels/", f"{tmp_path}/")],
                            capture_output=True, text=True, timeout=60)
    missing = [name.rsplit(".", 1)[1] for name, built in zip(kernels, present) if not built]
    assert (result.returncode == 0) == (not missing), result.stderr
    for name in missing:
        assert name in result.stderr


def test_runtime_stage_installs_the_wheel_without_a_compiler() -> None:
    stages = _stages(instructions(DOCKERFILE.read_text()))
    build = next(name for name, (_, steps) in stages.items()
                 if any(kind == "RUN" and "pip wheel" in rest for kind, rest in steps))
    # The last stage is the image; it starts from deps again, not from the
    # stage with the compiler, and installs nothing from apt.
    base, steps = list(stages.values())[-1]
    assert base == "deps"
    runs = [rest for kind, rest in steps if kind == "RUN"]
    assert not any("apt-get" in rest or "gcc" in rest for rest in runs)
    # The wheel, offline, through a bind mount from the build stage (no layer
    # keeps it); no source is copied in.
    install = next(rest for rest in runs if "pip install" in rest)
    assert install.startswith(f"--mount=type=bind,from={build},source=/wheels,target=/wheels ")
    assert "--no-index" in install and "/wheels/embedserve-*.whl" in install
    assert not any(kind == "COPY" for kind, _ in steps)
