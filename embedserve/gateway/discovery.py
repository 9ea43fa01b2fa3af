"""Where the gateway finds its scheduler replicas: a static list or a DNS name.

    --upstream host:port,host:port     a fixed list (replicas.StaticSource)
    --upstream dns:NAME:PORT           DnsSource: every address NAME resolves
                                       to, re-resolved every ``interval_s``
    --upstream unix:/PATH,...          replicas on this machine, over their Unix
                                       domain sockets (``embedserve serve`` uses these)

A DNS name is how clusters publish replicas: Docker's embedded DNS answers a
compose service name with every container of the service, and a Kubernetes
headless Service answers with every *ready* pod. Re-resolving makes
``--scale`` / an HPA scale-up visible to a running gateway without a restart.

This module owns resolving names only. The replica pool (replicas.py) owns
connections, health and balancing: it iterates ``source.watch()``, adds the
addresses that appear and retires the ones that disappear.
"""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass

from embedserve.gateway.replicas import ReplicaSource, StaticSource
from embedserve.link.addresses import UNIX_PREFIX, format_address, split_host_port

logger = logging.getLogger(__name__)

# host, port -> the addresses the name resolves to, as "host:port" strings.
Resolver = Callable[[str, int], Awaitable[list[str]]]

DNS_PREFIX = "dns:"


async def resolve_all(host: str, port: int) -> list[str]:
    """Every TCP address of ``host`` (A and AAAA), via the system resolver."""
    loop = asyncio.get_running_loop()
    infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return sorted({format_address(str(info[4][0]), port) for info in infos})


@dataclass(frozen=True)
class DnsSource:
    """Replicas behind one DNS name, re-resolved every ``interval_s``.

    A failed lookup keeps the last known set (a DNS hiccup must not empty
    the pool; the pool's health checks take dead replicas out anyway). A
    lookup that succeeds with no address yields an empty tuple.
    """

    host: str
    port: int
    interval_s: float = 5.0
    resolve: Resolver = resolve_all

    async def watch(self) -> AsyncIterator[tuple[str, ...]]:
        """Yield the sorted addresses now, then again each time they change."""
        last: tuple[str, ...] | None = None
        while True:
            try:
                current = tuple(sorted(set(await self.resolve(self.host, self.port))))
            except (OSError, UnicodeError) as exc:  # socket.gaierror is an OSError
                logger.warning("resolving replicas %s:%d failed: %s", self.host, self.port, exc)
                current = last if last is not None else ()
            if current != last:
                last = current
                yield current
            await asyncio.sleep(self.interval_s)


def source_for(upstreams: Sequence[str], interval_s: float = 5.0) -> ReplicaSource:
    """The source named by ``--upstream``: one ``dns:NAME:PORT`` or ``host:port`` entries.

    ValueError naming the entry when it is malformed.
    """
    entries = [entry.strip() for spec in upstreams for entry in spec.split(",") if entry.strip()]
    if not entries:
        raise ValueError("--upstream needs host:port[,host:port...] or dns:NAME:PORT")
    if any(entry.startswith(DNS_PREFIX) for entry in entries):
        if len(entries) != 1:
            raise ValueError("--upstream dns:NAME:PORT cannot be mixed with other entries")
        host, port = split_host_port(entries[0][len(DNS_PREFIX):])
        return DnsSource(host, port, interval_s)
    return StaticSource(entry if entry.startswith(UNIX_PREFIX) and len(entry) > len(UNIX_PREFIX)
                        else format_address(*split_host_port(entry)) for entry in entries)
