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


# Spins (about 0.1 ms) an idle OpenMP thread of a local replica makes before it
# sleeps. libgomp's default, 300,000, keeps a worker spinning for milliseconds
# after every step, on the core the gateway and the replica's own event loop
# need right then to answer; the gaps between the parallel regions inside one
# forward are far shorter than this, so the compute keeps its spinning hand-offs.
# Only where the caller's environment does not say (OMP_WAIT_POLICY=active or a
# GOMP_SPINCOUNT of their own win). The PyTorch CPU wheels use libgomp.
REPLICA_OMP_SPINCOUNT = "20000"


def replica_env(replicas: int, device: str, base: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment for replicas (``base``, default ours): on CPU they split the cores,
    and their OpenMP threads stop spinning soon after a step (``REPLICA_OMP_SPINCOUNT``)."""
    env = dict(os.environ if base is None else base)
    if device == "cpu":
        if replicas > 1:
            # Without this each replica would start one thread per core.
            env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // replicas)))
        if "OMP_WAIT_POLICY" not in env:
            env.setdefault("GOMP_SPINCOUNT", REPLICA_OMP_SPINCOUNT)
    return env
