"""Replicas' Prometheus metrics, merged into the gateway's ``/metrics``.

``embedserve serve`` runs its replicas as local processes that nobody else
can reach; their scheduler and engine metrics (queue, batch sizes, step time,
graph replays, ...) are scraped here when the gateway's ``/metrics`` is, each
sample labelled with the replica it came from (``replica="ADDRESS"``), and
appended after the gateway's own. A replica that does not answer within the
timeout is left out of that scrape (its health is the gateway's health
watch's business, not this). Knows nothing about what the metrics mean.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator, Sequence

import httpx
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

SCRAPE_TIMEOUT_S = 2.0
REPLICA_LABEL = "replica"


async def scrape(replicas: Sequence[tuple[str, str]], timeout_s: float = SCRAPE_TIMEOUT_S) -> bytes:
    """The metrics of ``replicas`` ((label, URL) each) as one exposition text."""
    # The replicas' metrics are plain HTTP on local addresses (launch/supervisor.py): no
    # TLS context to build (loading the CA bundle cost ~28 ms of CPU a scrape, so a
    # scrape every 100 ms took 14 % of a 2-core machine) and no proxy to read from the
    # environment.
    async with httpx.AsyncClient(timeout=timeout_s, verify=False, trust_env=False) as client:
        texts = await asyncio.gather(*(_fetch(client, url) for _, url in replicas))
    return merge([(label, text) for (label, _), text in zip(replicas, texts) if text is not None])


async def _fetch(client: httpx.AsyncClient, url: str) -> str | None:
    try:
        reply = await client.get(url)
    except httpx.HTTPError:
        return None
    return reply.text if reply.status_code == 200 else None


def merge(texts: Sequence[tuple[str, str]]) -> bytes:
    """Exposition texts of several replicas -> one, each family once, every sample carrying
    ``replica=LABEL`` (so the series of two replicas never collide)."""
    families: dict[str, Metric] = {}
    for label, text in texts:
        for family in text_string_to_metric_families(text):
            merged = families.get(family.name)
            if merged is None:
                merged = families[family.name] = Metric(family.name, family.documentation,
                                                         family.type, family.unit)
            merged.samples += [Sample(s.name, {REPLICA_LABEL: label, **s.labels}, s.value,
                                      s.timestamp, s.exemplar) for s in family.samples]
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Families(list(families.values())))
    return generate_latest(registry)


class _Families:
    """A collector that yields fixed metric families (what ``generate_latest`` renders)."""

    def __init__(self, families: list[Metric]) -> None:
        self._families = families

    def collect(self) -> Iterator[Metric]:
        return iter(self._families)
