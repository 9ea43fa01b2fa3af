"""One-shot health probe: ``python -m embedserve.healthprobe TARGET [--timeout S]``.

TARGET is ``http://host:port/path`` (healthy: HTTP 200, as the gateway's
``/ready`` answers once a replica serves) or ``grpc://host:port[/service]``
(healthy: grpc.health.v1 ``Check`` says SERVING, as a scheduler does once its
engine is warm). Exit status 0 when healthy, 1 when not.

Container healthchecks run this (the image has no curl and no
grpc_health_probe binary), and ``embedserve cluster`` uses ``probe`` to hold
the gateway back until its replicas serve. It imports only the
standard library and grpc, so a probe every few seconds stays cheap.
"""

from __future__ import annotations

import argparse
import sys
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Sequence

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc


def probe_http(url: str, timeout_s: float) -> bool:
    """True when GET ``url`` answers 200 within ``timeout_s``."""
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as response:  # noqa: S310 (http only)
            return response.status == 200
    except (urllib.error.URLError, OSError, ValueError):
        return False


def probe_grpc(address: str, timeout_s: float, service: str = "") -> bool:
    """True when the gRPC health service at ``address`` reports SERVING."""
    with grpc.insecure_channel(address) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        try:
            reply = stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=timeout_s)
        except grpc.RpcError:
            return False
    return reply.status == health_pb2.HealthCheckResponse.SERVING


def probe(target: str, timeout_s: float = 3.0) -> bool:
    """Probe ``http://...`` or ``grpc://host:port[/service]``; see the module docstring."""
    parsed = urllib.parse.urlsplit(target)
    if parsed.scheme in ("http", "https"):
        return probe_http(target, timeout_s)
    if parsed.scheme == "grpc" and parsed.netloc:
        return probe_grpc(parsed.netloc, timeout_s, service=parsed.path.lstrip("/"))
    raise ValueError(f"probe target must be http://host:port/path or grpc://host:port, got {target!r}")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m embedserve.healthprobe",
                                     description="Exit 0 when TARGET is healthy, 1 when it is not.")
    parser.add_argument("target", help="http://host:port/path or grpc://host:port[/service]")
    parser.add_argument("--timeout", type=float, default=3.0, help="seconds to wait for the answer")
    args = parser.parse_args(argv)
    try:
        healthy = probe(args.target, timeout_s=args.timeout)
    except ValueError as exc:
        parser.error(str(exc))
    return 0 if healthy else 1


if __name__ == "__main__":
    sys.exit(main())
