"""DNS discovery of replicas (embedserve.gateway.discovery) with the real pool.

The end-to-end test runs two real scheduler replicas (tiny model) on the
same port of two loopback addresses, 127.0.0.1 and 127.0.0.2, as two hosts
behind one service name would be, and drives the gateway's real
``ReplicaPool`` from a ``DnsSource``. Only the name lookup is scripted (at
the source's resolver seam: there is no DNS server to reconfigure here), so
the test can scale the "service" up and down under the running pool.
"""

from __future__ import annotations

import asyncio
import socket
from pathlib import Path

import pytest

from embedserve.gateway.discovery import DnsSource, resolve_all, source_for, split_host_port
from embedserve.gateway.replicas import ReplicaPool, StaticSource


def test_upstream_spec_picks_the_source() -> None:
    static = source_for(["127.0.0.1:5001,127.0.0.2:5002"])
    assert isinstance(static, StaticSource)
    assert static.addresses == ("127.0.0.1:5001", "127.0.0.2:5002")
    dns = source_for(["dns:replica:50051"], interval_s=2.0)
    assert dns == DnsSource("replica", 50051, 2.0)
    assert source_for(["[::1]:7000"]).addresses == ("[::1]:7000",)


@pytest.mark.parametrize("spec, message", [
    ("", "needs host:port"),
    ("replica", "expected host:port"),
    ("replica:http", "expected host:port"),
    ("replica:70000", "expected host:port"),
    ("dns:replica", "expected host:port"),
    ("dns:replica:50051,127.0.0.1:5001", "cannot be mixed"),
])
def test_malformed_upstream_is_refused_naming_it(spec: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        source_for([spec])


def test_split_host_port_handles_ipv6() -> None:
    assert split_host_port("[::1]:8000") == ("::1", 8000)
    assert split_host_port("replica.default.svc:50051") == ("replica.default.svc", 50051)


def test_system_resolver_finds_localhost() -> None:
    addresses = asyncio.run(resolve_all("localhost", 4242))
    assert "127.0.0.1:4242" in addresses
    with pytest.raises(socket.gaierror):
        asyncio.run(resolve_all("no-such-host.invalid", 4242))


class ScriptedResolver:
    """The answer a DNS server would give now; the test changes it."""

    def __init__(self, answer: list[str]) -> None:
        self.answer = answer
        self.fail = False
        self.lookups = 0

    async def __call__(self, host: str, port: int) -> list[str]:
        self.lookups += 1
        if self.fail:
            raise socket.gaierror(socket.EAI_AGAIN, "Temporary failure in name resolution")
        return list(self.answer)


def test_dns_source_yields_only_changes_and_keeps_the_last_set_on_errors() -> None:
    async def scenario() -> list[tuple[str, ...]]:
        resolver = ScriptedResolver(["10.0.0.2:1", "10.0.0.1:1"])
        source = DnsSource("replica", 1, interval_s=0.01, resolve=resolver)
        seen: list[tuple[str, ...]] = []

        async def follow() -> None:
            async for addresses in source.watch():
                seen.append(addresses)

        task = asyncio.create_task(follow())
        await asyncio.sleep(0.1)          # several lookups, one answer
        resolver.fail = True
        await asyncio.sleep(0.1)          # failures: nothing new, nothing dropped
        resolver.fail = False
        resolver.answer = ["10.0.0.1:1"]
        await asyncio.sleep(0.1)
        resolver.answer = []
        await asyncio.sleep(0.1)
        task.cancel()
        assert resolver.lookups > 10
        return seen

    assert asyncio.run(scenario()) == [("10.0.0.1:1", "10.0.0.2:1"), ("10.0.0.1:1",), ()]


async def _start_replica(model_dir: Path, host: str, port: int):  # noqa: ANN202
    from embedserve.engine import Engine
    from embedserve.scheduler.server import create_server
    from embedserve.scheduler.settings import SchedulerSettings

    engine = await asyncio.to_thread(Engine.load, model_dir, "cpu")
    settings = SchedulerSettings(model_dir=model_dir, host=host, port=port)
    server, bound = await create_server(settings, engine)
    return server, engine, bound


async def _wait_for(pool: ReplicaPool, healthy: set[str], timeout_s: float = 30.0) -> None:
    async def done() -> None:
        while {r.address for r in pool.healthy()} != healthy or \
                {r.address for r in pool.replicas} != healthy:
            await asyncio.sleep(0.05)
    await asyncio.wait_for(done(), timeout_s)


def test_pool_follows_the_name_as_replicas_come_and_go(tiny_bert_dir: Path) -> None:
    async def scenario() -> None:
        first, engine_a, port = await _start_replica(tiny_bert_dir, "127.0.0.1", 0)
        # The same port on another loopback address: a second "host".
        second, engine_b, _ = await _start_replica(tiny_bert_dir, "127.0.0.2", port)
        a, b = f"127.0.0.1:{port}", f"127.0.0.2:{port}"
        resolver = ScriptedResolver([a])
        pool = ReplicaPool(DnsSource("replica", port, interval_s=0.05, resolve=resolver))
        await pool.start()
        try:
            await _wait_for(pool, {a})
            resolver.answer = [a, b]                     # scaled up: no restart needed
            await _wait_for(pool, {a, b})
            assert all(r.info is not None and r.info.dimension == 32 for r in pool.healthy())
            resolver.answer = [b]                        # scaled down
            await _wait_for(pool, {b})
            resolver.fail = True                         # DNS hiccup: keep what we have
            await asyncio.sleep(0.3)
            assert {r.address for r in pool.healthy()} == {b}
        finally:
            await pool.close()
            for server, engine in ((first, engine_a), (second, engine_b)):
                await server.stop()
                engine.close()

    asyncio.run(scenario())
