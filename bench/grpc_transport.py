"""gRPC over loopback TCP vs a Unix domain socket: one replica-sized hop, nothing else.

    python -m bench grpc_transport [--calls 2000] [--block 100]

A child process serves grpc.health.v1 (a tiny unary call, no model) on
127.0.0.1:0 and on a Unix socket; this process calls ``Check`` over both
channels with grpc.aio (as the gateway does), in alternating blocks so
background load hits both alike, and reports p50/p90 per transport and
their ratio. What ``embedserve serve`` saves per request by dialing its
replicas at ``unix:PATH`` (``launch/supervisor.py``).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import grpc
import numpy as np
from grpc_health.v1 import health_pb2, health_pb2_grpc

_SERVER = """
import asyncio, sys
import grpc
from grpc_health.v1 import health, health_pb2_grpc

async def main():
    server = grpc.aio.server()
    health_pb2_grpc.add_HealthServicer_to_server(health.aio.HealthServicer(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.add_insecure_port("unix:" + sys.argv[1])
    await server.start()
    print(port, flush=True)
    await server.wait_for_termination()

asyncio.run(main())
"""


async def _measure(targets: dict[str, str], calls: int, block: int) -> dict[str, list[float]]:
    channels = {name: grpc.aio.insecure_channel(target) for name, target in targets.items()}
    stubs = {name: health_pb2_grpc.HealthStub(channel) for name, channel in channels.items()}
    request = health_pb2.HealthCheckRequest(service="")
    samples: dict[str, list[float]] = {name: [] for name in targets}
    for stub in stubs.values():                      # connect and warm both
        for _ in range(50):
            await stub.Check(request, timeout=10)
    done = 0
    while done < calls:
        for name, stub in stubs.items():
            for _ in range(block):
                started = time.perf_counter()
                await stub.Check(request, timeout=10)
                samples[name].append((time.perf_counter() - started) * 1e6)
        done += block
    for channel in channels.values():
        await channel.close()
    return samples


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench grpc_transport",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=2000, help="calls per transport")
    parser.add_argument("--block", type=int, default=100, help="calls per transport per turn")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="es-bench-") as directory:
        socket_path = Path(directory) / "health.sock"
        server = subprocess.Popen([sys.executable, "-c", _SERVER, str(socket_path)],
                                  stdout=subprocess.PIPE, text=True)
        try:
            assert server.stdout is not None
            port = int(server.stdout.readline())
            load = os.getloadavg()[0]
            samples = asyncio.run(_measure({"tcp": f"127.0.0.1:{port}", "unix": f"unix:{socket_path}"},
                                           args.calls, args.block))
        finally:
            server.terminate()
            server.wait(10)
    print(f"grpc.aio unary Check, {args.calls} calls per transport; load average {load:.2f}")
    for name, values in samples.items():
        print(f"{name:>5}: p50 {np.median(values):7.1f} us   p90 {np.percentile(values, 90):7.1f} us")
    print(f"unix/tcp p50: {np.median(samples['unix']) / np.median(samples['tcp']):.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
