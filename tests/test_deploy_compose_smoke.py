"""The compose cluster built and started for real: scripts/compose-smoke.sh under pytest.

Runs when a Docker engine with the compose plugin is reachable and the two
base images are on it (PYTHON_IMAGE, PROMETHEUS_IMAGE: the Docker Hub
defaults, or local builds from scripts/build-local-images.sh); otherwise it
skips and says which of these is missing. It builds the image and runs the
cluster (minutes, most of two cores). EMBEDSERVE_SMOKE_ARGS adds arguments,
e.g. ``--torch-wheel WHL --pip-mirror DIR`` on a machine without the
public internet. What is checked is the script's (compose_smoke.py); here
the exit status and the report's figures are asserted.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest

from deploy_validators import ROOT

SCRIPT = ROOT / "scripts" / "compose-smoke.sh"
DEFAULT_IMAGES = {"PYTHON_IMAGE": "python:3.11-slim-bookworm", "PROMETHEUS_IMAGE": "prom/prometheus:v3.5.0"}


def _docker_ok(*args: str) -> bool:
    result = subprocess.run(["docker", *args], capture_output=True, timeout=60, check=False)
    return result.returncode == 0


def missing_prerequisite() -> str | None:
    """Why the smoke test cannot run here, or None when it can."""
    if shutil.which("docker") is None:
        return "no docker command"
    if not _docker_ok("info"):
        return "no Docker engine reachable (docker info failed)"
    if not _docker_ok("compose", "version"):
        return "no Docker Compose v2 plugin (docker compose version failed)"
    for variable, default in DEFAULT_IMAGES.items():
        image = os.environ.get(variable, default)
        if not _docker_ok("image", "inspect", image):
            return (f"base image {image} ({variable}) is not on the engine: docker pull it, or run "
                    f"scripts/build-local-images.sh and set {variable}")
    return None


@pytest.mark.slow
@pytest.mark.timeout(3600)
def test_compose_cluster_end_to_end(tmp_path: Path) -> None:
    reason = missing_prerequisite()
    if reason is not None:
        pytest.skip(reason)
    report = tmp_path / "report.json"
    extra = shlex.split(os.environ.get("EMBEDSERVE_SMOKE_ARGS", ""))
    result = subprocess.run([str(SCRIPT), "--project", f"embedserve-pytest-{os.getpid()}", "--report",
                             str(report), *extra], capture_output=True, text=True, timeout=3500, check=False)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    figures = json.loads(report.read_text())
    assert figures["passed"] is True
    assert figures["parity_min_cosine"] >= 0.9999
    for phase in ("crash_load", "docker_kill_load"):
        assert figures[phase]["lost"] == 0 and figures[phase]["wrong"] == 0 and figures[phase]["ok"] > 0, phase
    assert figures["third_replica_calls"] > 0
