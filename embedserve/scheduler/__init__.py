"""The scheduler tier: a grpc.aio server that batches sequences for one engine.

Serves ``embedserve.v1.Inference`` (protos/embedserve/v1/inference.proto),
``grpc.health.v1`` and server reflection. Sequences from all calls join the
first-come-first-served queue of their priority class (interactive or batch,
docs/priority.md), each bounded in tokens; a loop cuts them into batches
under a token budget, interactive sequences first and keeps up to ``in_flight_depth`` engine
steps running (on CPU, steps of calls that came over frames are computed by
the loop itself, one at a time). Modules, one job each:

    policy.py    plan_batch: the pure FCFS token-budget rule; plan_priority_batch: the
                 same over the two classes' queues
    pool.py      Call (one RPC's result handle), RequestPool (admission, queues)
    batcher.py   the engine loop: form, submit, route rows back, fail batches
    servicer.py  the Inference servicer (decode, validate, post-process)
    metrics.py   Prometheus metrics in a per-server registry, /metrics endpoint
    server.py    SchedulerServer / create_server: start-up, warm-up, drain, stop; the
                 same handlers served as frames (``embedserve.link.frame_server``)
    settings.py  SchedulerSettings (frozen), built by cli.py from flags
    cli.py       ``embedserve scheduler``: signals, SIGTERM drain

    server, port = await create_server(SchedulerSettings(model_dir=...), engine)
"""

from typing import Any

__all__ = ["SchedulerServer", "SchedulerSettings", "create_server"]


def __getattr__(name: str) -> Any:
    # Lazy: ``embedserve --help`` imports scheduler.cli, which must not pull
    # in grpc and torch just to list subcommands.
    if name in ("SchedulerServer", "create_server"):
        from embedserve.scheduler import server

        return getattr(server, name)
    if name == "SchedulerSettings":
        from embedserve.scheduler.settings import SchedulerSettings

        return SchedulerSettings
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
