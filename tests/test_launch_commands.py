"""``launch.commands.replica_env``: what the launchers put in a local replica's environment;
and the event loop every server process runs on."""

from __future__ import annotations

import asyncio
import os

import uvloop

from embedserve.entrypoint import run_event_loop
from embedserve.launch.commands import REPLICA_OMP_SPINCOUNT, replica_env


def test_cpu_replicas_get_a_short_openmp_spin_unless_the_caller_says_otherwise():
    assert replica_env(1, "cpu", {"PATH": "/bin"}) == {"PATH": "/bin",
                                                       "GOMP_SPINCOUNT": REPLICA_OMP_SPINCOUNT}
    assert replica_env(1, "cpu", {"GOMP_SPINCOUNT": "300000"})["GOMP_SPINCOUNT"] == "300000"
    assert "GOMP_SPINCOUNT" not in replica_env(1, "cpu", {"OMP_WAIT_POLICY": "active"})
    assert replica_env(2, "cuda:0", {"PATH": "/bin"}) == {"PATH": "/bin"}


def test_cpu_replicas_split_the_cores():
    env = replica_env(2, "cpu", {})
    assert env["OMP_NUM_THREADS"] == str(max(1, (os.cpu_count() or 1) // 2))
    assert replica_env(2, "cpu", {"OMP_NUM_THREADS": "3"})["OMP_NUM_THREADS"] == "3"
    assert "OMP_NUM_THREADS" not in replica_env(1, "cpu", {})


def test_server_processes_run_on_uvloop():
    async def loop_type() -> type:
        return type(asyncio.get_running_loop())
    assert run_event_loop(loop_type()) is uvloop.Loop
