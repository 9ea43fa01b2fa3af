"""How the gateway writes a replica's address: ``host:port``, ``[v6]:port`` or ``unix:PATH``."""

from __future__ import annotations

UNIX_PREFIX = "unix:"   # a gRPC target: unix:/absolute/path or unix:relative/path


def format_address(host: str, port: int) -> str:
    """``host:port``, bracketing IPv6 literals as gRPC targets need."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def split_host_port(address: str) -> tuple[str, int]:
    """Parse ``host:port`` / ``[v6]:port``; ValueError naming the address if malformed."""
    host, sep, port_text = address.strip().rpartition(":")
    if not sep or not host or not port_text.isdigit() or not 0 < int(port_text) < 65536:
        raise ValueError(f"expected host:port, got {address!r}")
    return host.strip("[]"), int(port_text)
