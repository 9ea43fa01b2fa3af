"""One replica hop, nothing else: gRPC and frames, each over loopback TCP and a Unix socket.

    python -m bench grpc_transport [--calls 2000] [--block 100]

A child process serves grpc.health.v1 (a tiny unary call, no model) on
127.0.0.1:0 and on a Unix socket, and frame sockets (embedserve/link/frames.py) on both
whose ``Info`` answers an empty message at once; this process calls ``Check`` over
both gRPC channels with grpc.aio (as the gateway does) and ``Info`` over a
``FrameChannel`` to each frame socket, in alternating blocks so background load hits
all alike, and reports p50/p90 per transport and the ratios to gRPC over TCP. What a
gateway saves per request by calling its replicas with frames
(``embedserve/link/frame_client.py``): at ``unix:PATH`` (``embedserve serve``) and at
``host:port`` (remote replicas, their ``--frame-port``).
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import grpc
import numpy as np
from grpc_health.v1 import health_pb2, health_pb2_grpc

from embedserve.link.frame_client import FrameChannel
from embedserve.link.frames import frame_socket_path
from embedserve.protos import inference_pb2

_SERVER = """
import asyncio, sys
import grpc
from grpc_health.v1 import health, health_pb2_grpc
from embedserve.link.frames import frame_socket_path
from embedserve.protos import inference_pb2
from embedserve.link.frame_server import FrameServer

class EmptyInfo:
    instance_id = ""

    async def Info(self, request, context):
        return inference_pb2.InfoResponse()

async def main():
    server = grpc.aio.server()
    health_pb2_grpc.add_HealthServicer_to_server(health.aio.HealthServicer(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.add_insecure_port("unix:" + sys.argv[1])
    await server.start()
    frame_server = FrameServer(EmptyInfo(), token=None, max_payload=1 << 20, max_calls=1024)
    await frame_server.start_unix(frame_socket_path(sys.argv[1]))
    frame_port = await frame_server.start_tcp("127.0.0.1", 0)
    print(port, frame_port, flush=True)
    await server.wait_for_termination()

asyncio.run(main())
"""


async def _measure(targets: dict[str, str], frame_targets: dict[str, Path | tuple[str, int]],
                   calls: int, block: int) -> dict[str, list[float]]:
    channels = {name: grpc.aio.insecure_channel(target) for name, target in targets.items()}
    request = health_pb2.HealthCheckRequest(service="")
    callers = {name: functools.partial(health_pb2_grpc.HealthStub(channel).Check, request, timeout=10)
               for name, channel in channels.items()}
    frame_channels = [await FrameChannel.open(target, None, timeout_s=10) for target in frame_targets.values()]
    for name, channel in zip(frame_targets, frame_channels):
        callers[name] = functools.partial(channel.call, "Info", inference_pb2.InfoRequest(), 10)
    samples: dict[str, list[float]] = {name: [] for name in callers}
    for call in callers.values():                    # connect and warm all
        for _ in range(50):
            await call()
    done = 0
    while done < calls:
        for name, call in callers.items():
            for _ in range(block):
                started = time.perf_counter()
                await call()
                samples[name].append((time.perf_counter() - started) * 1e6)
        done += block
    for frame_channel in frame_channels:
        frame_channel.close()
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
            port, frame_port = map(int, server.stdout.readline().split())
            load = os.getloadavg()[0]
            samples = asyncio.run(_measure({"tcp": f"127.0.0.1:{port}", "unix": f"unix:{socket_path}"},
                                           {"frames tcp": ("127.0.0.1", frame_port),
                                            "frames unix": frame_socket_path(socket_path)},
                                           args.calls, args.block))
        finally:
            server.terminate()
            server.wait(10)
    print(f"grpc.aio unary Check (tcp, unix) and a frame Info call (frames tcp, frames unix), "
          f"{args.calls} calls each; load average {load:.2f}")
    for name, values in samples.items():
        print(f"{name:>11}: p50 {np.median(values):7.1f} us   p90 {np.percentile(values, 90):7.1f} us")
    for name in ("unix", "frames tcp", "frames unix"):
        print(f"{name}/tcp p50: {np.median(samples[name]) / np.median(samples['tcp']):.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
