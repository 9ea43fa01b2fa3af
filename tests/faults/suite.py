"""Fault-tolerance suite: break a live cluster under steady load and count answers.

    python -m tests.faults.suite [--mode auto|netns|loopback] [--phase-seconds 8] [--write RELIABILITY.md]

One gateway and two replicas run as separate processes, each on its own
network-namespace host when the machine allows it (``tests.faults.netns``), else on
loopback ports (then the link-cut fault is skipped, with the reason in the
table). While ``LoadGenerator`` clients send embedding requests with known
answers, the phases below run in order, each on a fresh count. A request is
counted in the phase it was sent in, and a phase ends only once all of its
requests are answered or lost. Traffic stays on this machine.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from bench.suite.report import write_section
from tests.faults.cluster import FaultCluster, Process
from tests.faults.load import Expected, LoadGenerator, reference_vectors
from tests.faults.netns import StarNetwork, namespaces_available
from tests.faults.report import PhaseResult, render_report, render_table

# The gateway's in-flight token budget during the suite: far above the steady
# load (a few hundred tokens in flight), far below the overload burst.
GATEWAY_BUDGET_TOKENS = 4096
OVERLOAD_REQUESTS, OVERLOAD_TEXTS = 48, 32


@dataclass
class Suite:
    cluster: FaultCluster
    load: LoadGenerator
    phase_s: float
    discovered: list[str] = field(default_factory=list)  # replicas the gateway knew at start
    results: list[PhaseResult] = field(default_factory=list)

    async def phase(self, name: str, fault: str, action: Callable[[PhaseResult], Awaitable[None]],
                    skip: str = "") -> PhaseResult:
        result = PhaseResult(name, fault, skipped=skip)
        self.results.append(result)
        if skip:
            return result
        self.load.next_phase()
        started = time.monotonic()
        await action(result)
        result.outcomes = self.load.next_phase()
        await self.load.settle(result.outcomes)
        result.facts["seconds"] = time.monotonic() - started
        return result

    def replica(self, index: int) -> Process:
        return self.cluster.replica_procs[index]

    async def restart(self, index: int, result: PhaseResult) -> None:
        """Start replica ``index`` again and wait until the gateway routes calls to it."""
        started = time.monotonic()
        proc = self.replica(index)
        proc.start()
        await asyncio.to_thread(proc.wait_listening, 240.0)
        result.facts["serving_s"] = time.monotonic() - started
        deadline = time.monotonic() + 60.0
        while await asyncio.to_thread(self.cluster.replica_calls_ok, index) < 1:
            if time.monotonic() > deadline:
                result.notes.append(f"replica {index} got no call within 60 s of serving")
                return
            await asyncio.sleep(0.5)
        rejoin_s = time.monotonic() - started
        result.facts["rejoin_s"] = rejoin_s
        result.notes.append(f"replica {index} restarted and answering gateway calls after {rejoin_s:.1f} s")


async def _sleep_rest(started: float, seconds: float) -> None:
    await asyncio.sleep(max(0.0, started + seconds - time.monotonic()))


async def run_phases(suite: Suite, link_cut_skip: str) -> list[PhaseResult]:
    t = suite.phase_s

    async def baseline(result: PhaseResult) -> None:
        how = "by DNS name" if suite.cluster.dns_discovery else "from a static list"
        result.notes.append(f"gateway found replicas {how}: {', '.join(suite.discovered)}")
        result.facts["replicas_known"] = len(suite.discovered)
        await asyncio.sleep(t)

    async def kill9(result: PhaseResult) -> None:
        started = time.monotonic()
        await asyncio.sleep(0.3 * t)
        suite.replica(0).signal(signal.SIGKILL)
        result.notes.append("replica 0 killed with SIGKILL mid-load")
        await _sleep_rest(started, t)

    async def restart(result: PhaseResult) -> None:
        started = time.monotonic()
        suite.replica(0).wait_exit(10.0)
        await suite.restart(0, result)
        await _sleep_rest(started, t)

    async def sigstop(result: PhaseResult) -> None:
        started = time.monotonic()
        await asyncio.sleep(0.2 * t)
        suite.replica(1).signal(signal.SIGSTOP)
        await asyncio.sleep(0.6 * t)
        suite.replica(1).signal(signal.SIGCONT)
        result.facts["fault_s"] = 0.6 * t
        result.notes.append(f"replica 1 stopped (SIGSTOP) for {0.6 * t:.1f} s, then continued")
        await _sleep_rest(started, t)

    async def link_cut(result: PhaseResult) -> None:
        network = suite.cluster.network
        assert network is not None
        started = time.monotonic()
        await asyncio.sleep(0.2 * t)
        network.links["replica0"].set_up(False)
        await asyncio.sleep(0.6 * t)
        network.links["replica0"].set_up(True)
        result.facts["fault_s"] = 0.6 * t
        result.notes.append(f"replica 0's link down for {0.6 * t:.1f} s (packets dropped), then up")
        await _sleep_rest(started, t)

    async def slow(result: PhaseResult) -> None:
        # Runs 25% of the time: stopped 150 ms, running 50 ms, repeatedly.
        started = time.monotonic()
        while time.monotonic() < started + t:
            suite.replica(1).signal(signal.SIGSTOP)
            await asyncio.sleep(0.15)
            suite.replica(1).signal(signal.SIGCONT)
            await asyncio.sleep(0.05)
        result.notes.append("replica 1 throttled to 25% of the time (SIGSTOP/SIGCONT duty cycle)")

    async def sigterm(result: PhaseResult) -> None:
        started = time.monotonic()
        await asyncio.sleep(0.3 * t)
        proc = suite.replica(0)
        proc.signal(signal.SIGTERM)
        status = await asyncio.to_thread(proc.wait_exit, 45.0)
        result.facts["exit_status"] = -1 if status is None else status
        result.notes.append(f"replica 0 drained and exited with status {status}; "
                            "it stays down for the rest of the run")
        await _sleep_rest(started, t)

    async def overload(result: PhaseResult) -> None:
        started = time.monotonic()
        await asyncio.gather(*(suite.load.send_one(OVERLOAD_TEXTS) for _ in range(OVERLOAD_REQUESTS)))
        result.notes.append(f"{OVERLOAD_REQUESTS} extra requests of {OVERLOAD_TEXTS} texts at once "
                            f"over a {GATEWAY_BUDGET_TOKENS}-token gateway budget")
        await _sleep_rest(started, t)

    await suite.phase("baseline", "none", baseline)
    await suite.phase("kill -9", "SIGKILL one replica", kill9)
    await suite.phase("restart", "start the killed replica again", restart)
    await suite.phase("hang", "SIGSTOP one replica, later SIGCONT", sigstop)
    await suite.phase("link cut", "drop every packet on one replica's link", link_cut, skip=link_cut_skip)
    await suite.phase("slow", "one replica runs 25% of the time", slow)
    await suite.phase("SIGTERM", "graceful drain of one replica mid-load", sigterm)
    await suite.phase("overload", "burst past the gateway's token budget", overload)
    return suite.results


async def _served_model(base_url: str) -> tuple[str, list[str]]:
    """The model id the gateway serves, and the replicas it knows: each address, and how
    its calls travel (frames or gRPC)."""
    async with httpx.AsyncClient(trust_env=False, timeout=10) as client:
        models = (await client.get(f"{base_url}/v1/models")).raise_for_status().json()
        info = (await client.get(f"{base_url}/info")).raise_for_status().json()
    return models["data"][0]["id"], sorted(f"{r['address']} ({r['calls']})" for r in info["replicas"])


async def run_suite(model_dir: Path, log_dir: Path, mode: str = "auto", phase_s: float = 6.0,
                    expected: Expected | None = None) -> tuple[str, list[PhaseResult]]:
    """Run every phase; returns (mode used, results). ``mode``: auto, netns or loopback."""
    available, why = namespaces_available()
    if mode == "netns" and not available:
        raise RuntimeError(f"namespace mode unavailable: {why}")
    use_netns = mode == "netns" or (mode == "auto" and available)
    expected = expected or reference_vectors(model_dir)
    network = StarNetwork(replicas=2).create() if use_netns else None
    # In namespace mode the gateway finds the replicas by name (discovery.py).
    cluster = FaultCluster(model_dir, log_dir, replicas=2, network=network, dns_discovery=use_netns,
                           gateway_flags=("--max-inflight-tokens", str(GATEWAY_BUDGET_TOKENS)))
    try:
        await asyncio.to_thread(cluster.start)
        model, replicas = await _served_model(cluster.gateway_url)
        async with LoadGenerator(cluster.gateway_url, model, expected) as load:
            suite = Suite(cluster, load, phase_s, discovered=replicas)
            skip = "" if use_netns else (f"needs network namespaces ({why or 'loopback mode was asked for'})"
                                         "; ran on loopback ports")
            results = await run_phases(suite, skip)
    finally:
        await asyncio.to_thread(cluster.stop)
        if network is not None:
            network.destroy()
    return ("netns" if use_netns else "loopback"), results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.faults.suite", description=__doc__.splitlines()[0])
    parser.add_argument("--mode", choices=("auto", "netns", "loopback"), default="auto")
    parser.add_argument("--phase-seconds", type=float, default=8.0)
    parser.add_argument("--model", type=Path, default=None, help="default: the default model")
    parser.add_argument("--write", type=Path, default=None, help="write the report (e.g. RELIABILITY.md)")
    args = parser.parse_args(argv)
    model_dir = args.model
    if model_dir is None:
        from embedserve.defaults.build import ensure_default_model
        from embedserve.defaults.model_args import default_cache_dir

        model_dir = ensure_default_model(default_cache_dir())
    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="embedserve-faults-") as logs:
        mode, results = asyncio.run(run_suite(model_dir, Path(logs), args.mode, args.phase_seconds))
    print(f"mode: {mode}\n{render_table(results)}")
    if args.write is not None:
        command = " ".join(["python -m tests.faults.suite", *(argv if argv is not None else sys.argv[1:])])
        # Only the fault section: the file holds other reports too (the compose run).
        write_section(args.write, "faults", render_report(mode, command, results, load_before))
    bad = sum(r.outcomes.wrong + r.outcomes.lost for r in results)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
