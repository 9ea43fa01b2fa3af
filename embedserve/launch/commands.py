"""The command line and environment of every process the launchers start.

One function per role (``scheduler_command``, ``gateway_command``), so
``serve``, ``cluster``, the fault harness and the tests start the same
processes the same way; the line each role prints once it listens, and the
pattern that reads it back, are in ``embedserve.entrypoint``.
Flags a caller adds (credentials, limits) go through ``extra`` and
environment through ``replica_env``'s ``base``. Knows nothing about running
the processes (``processes.py``).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from embedserve.defaults.model_args import ModelSpec

_EMBEDSERVE = (sys.executable, "-m", "embedserve.cli")


def scheduler_command(model_dir: Path, host: str = "127.0.0.1", port: int = 0,
                      metrics_port: int | None = None, device: str = "cpu",
                      extra: Sequence[str] = ()) -> list[str]:
    """argv of one scheduler replica; port 0 lets it pick one and print it."""
    argv = [*_EMBEDSERVE, "scheduler", "--model", str(model_dir), "--device", device,
            "--host", host, "--port", str(port)]
    if metrics_port is not None:
        argv += ["--metrics-port", str(metrics_port)]
    return [*argv, *extra]


def gateway_command(model_dir: Path, upstream: str, host: str = "127.0.0.1", port: int = 0,
                    extra: Sequence[str] = ()) -> list[str]:
    """argv of the gateway; ``upstream`` is ``host:port,...`` or ``dns:NAME:PORT``."""
    return [*_EMBEDSERVE, "gateway", "--upstream", upstream, "--model", str(model_dir),
            "--host", host, "--port", str(port), *extra]


def models_gateway_command(models: Sequence[ModelSpec], host: str = "127.0.0.1", port: int = 0,
                           extra: Sequence[str] = ()) -> list[str]:
    """argv of a gateway serving ``models``, each spec naming its replicas (``upstream``)."""
    argv = [*_EMBEDSERVE, "gateway"]
    for spec in models:
        argv += ["--model", spec.format()]
    return [*argv, "--host", host, "--port", str(port), *extra]


def replica_env(replicas: int, device: str, base: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment for replicas (``base``, default ours): on CPU they split the cores."""
    env = dict(os.environ if base is None else base)
    if replicas > 1 and device == "cpu":
        # Without this each replica would start one thread per core.
        env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // replicas)))
    return env
