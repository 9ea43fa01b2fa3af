"""Hosts for the fault suite: network namespaces joined by veth links.

Builds a star: the caller (this process, the root namespace) reaches the
gateway host over one link, and the gateway reaches each replica host over a
link of its own, so cutting one replica's link isolates exactly that
replica. Addresses come from 198.18.0.0/15 (RFC 2544, set aside for
benchmark networks): the caller's link a free 198.19.X.0/24, the replica
links 198.18.N.0/24 inside the run's own namespaces. No namespace has a
default route, so nothing can leave the machine. The gateway host gets an ``/etc/netns/<ns>/hosts`` file naming
every replica ``replicas``, which ``ip netns exec`` mounts over /etc/hosts:
the gateway's DNS discovery resolves that name to all replica addresses
through the ordinary system resolver.

Needs root and iproute2; ``namespaces_available()`` says whether this machine
allows it (the suite falls back to loopback ports otherwise).
"""

from __future__ import annotations

import os
import random
import shutil
import subprocess
import uuid
from dataclasses import dataclass, field
from pathlib import Path

REPLICAS_NAME = "replicas"
_NETNS_ETC = Path("/etc/netns")


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=check, timeout=10)


def namespaces_available() -> tuple[bool, str]:
    """(True, "") when namespaces and veth links can be made here, else (False, why)."""
    if shutil.which("ip") is None:
        return False, "iproute2's `ip` is not installed"
    if os.geteuid() != 0:
        return False, "network namespaces need root"
    probe = f"esprobe{uuid.uuid4().hex[:6]}"
    made = _ip("netns", "add", probe, check=False)
    if made.returncode != 0:
        return False, f"`ip netns add` failed: {made.stderr.strip()}"
    try:
        veth = _ip("link", "add", f"{probe}a", "type", "veth", "peer", "name", f"{probe}b",
                   check=False)
        if veth.returncode != 0:
            return False, f"veth links unavailable: {veth.stderr.strip()}"
        _ip("link", "del", f"{probe}a", check=False)
    finally:
        _ip("netns", "del", probe, check=False)
    return True, ""


def _free_client_prefix() -> str:
    """A 198.19.X /24 that nothing in the root namespace routes yet."""
    routes = _ip("-4", "route", "show").stdout
    for _ in range(100):
        prefix = f"198.19.{random.randrange(256)}"
        if f"{prefix}.0/24" not in routes:
            return prefix
    raise RuntimeError("no free 198.19.X.0/24 subnet for the caller's link")


@dataclass
class Link:
    """One veth pair: ``near`` end on the hub side, ``far`` end in a host namespace."""

    near_ns: str | None  # None: the root namespace
    near_dev: str
    far_ns: str
    far_dev: str

    def set_up(self, up: bool) -> None:
        """Bring the hub side of the link up or down (down drops every packet)."""
        state = "up" if up else "down"
        args = ["link", "set", self.near_dev, state]
        _ip(*(["-n", self.near_ns, *args] if self.near_ns else args))


@dataclass
class StarNetwork:
    """A gateway host and N replica hosts; see the module docstring."""

    replicas: int
    tag: str = field(default_factory=lambda: uuid.uuid4().hex[:6])
    links: dict[str, Link] = field(default_factory=dict)
    addresses: dict[str, str] = field(default_factory=dict)

    @property
    def gateway_ns(self) -> str:
        return f"es{self.tag}gw"

    def replica_ns(self, index: int) -> str:
        return f"es{self.tag}r{index}"

    def namespaces(self) -> list[str]:
        return [self.gateway_ns] + [self.replica_ns(i) for i in range(self.replicas)]

    def create(self) -> StarNetwork:
        try:
            for ns in self.namespaces():
                _ip("netns", "add", ns)
                _ip("-n", ns, "link", "set", "lo", "up")
            # The caller's link is the only subnet the root namespace sees: pick
            # one no other run (or anything else) routes, so concurrent runs
            # never reach each other's gateway. The rest live inside the run's
            # own namespaces.
            self._link(None, "client", self.gateway_ns, "gateway", prefix=_free_client_prefix())
            for i in range(self.replicas):
                self._link(self.gateway_ns, f"replica{i}", self.replica_ns(i), f"replica{i}",
                           prefix=f"198.18.{i + 1}")
            hosts = _NETNS_ETC / self.gateway_ns
            hosts.mkdir(parents=True, exist_ok=True)
            lines = ["127.0.0.1 localhost"] + [
                f"{self.addresses[f'replica{i}']} {REPLICAS_NAME}" for i in range(self.replicas)]
            (hosts / "hosts").write_text("\n".join(lines) + "\n")
        except BaseException:
            self.destroy()
            raise
        return self

    def _link(self, near_ns: str | None, near_name: str, far_ns: str, far_name: str,
              prefix: str) -> None:
        index = len(self.links)
        near_dev, far_dev = f"es{self.tag}n{index}", f"es{self.tag}f{index}"
        _ip("link", "add", near_dev, "type", "veth", "peer", "name", far_dev)
        _ip("link", "set", far_dev, "netns", far_ns)
        if near_ns is not None:
            _ip("link", "set", near_dev, "netns", near_ns)
        near_addr, far_addr = f"{prefix}.1", f"{prefix}.2"
        in_near = ["-n", near_ns] if near_ns else []
        _ip(*in_near, "addr", "add", f"{near_addr}/24", "dev", near_dev)
        _ip(*in_near, "link", "set", near_dev, "up")
        _ip("-n", far_ns, "addr", "add", f"{far_addr}/24", "dev", far_dev)
        _ip("-n", far_ns, "link", "set", far_dev, "up")
        self.links[far_name] = Link(near_ns, near_dev, far_ns, far_dev)
        self.addresses[far_name] = far_addr

    def wrap(self, ns: str, argv: list[str]) -> list[str]:
        """``argv`` run inside namespace ``ns``."""
        return ["ip", "netns", "exec", ns, *argv]

    def destroy(self) -> None:
        for ns in self.namespaces():
            _ip("netns", "del", ns, check=False)  # takes its veth ends with it
        for link in self.links.values():
            if link.near_ns is None:
                _ip("link", "del", link.near_dev, check=False)
        shutil.rmtree(_NETNS_ETC / self.gateway_ns, ignore_errors=True)

    def __enter__(self) -> StarNetwork:
        return self.create()

    def __exit__(self, *exc: object) -> None:
        self.destroy()
