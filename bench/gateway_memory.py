"""Gateway memory: resident set of an ``embedserve gateway`` process, idle and after traffic.

    python -m bench gateway_memory [--model DIR] [--requests 200] [--pythonpath DIR]

Starts one ``embedserve scheduler`` replica and one ``embedserve gateway`` in
front of it as real processes (default model, CPU), reads the gateway's VmRSS
from /proc once it listens, once the replica is ready, and after
``--requests`` embedding requests of mixed sizes (1-32 texts of 3-200 words).
``--pythonpath DIR`` runs another checkout's code (e.g. one exported with
``git archive``) so that a change can be compared with the code before it.
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import time
from pathlib import Path

import httpx

from embedserve.defaults.model_args import default_cache_dir
from embedserve.entrypoint import GATEWAY_LISTENING, SCHEDULER_LISTENING
from embedserve.launch.processes import popen_listening, stop_popen

WORDS = ("the quick brown fox jumps over a lazy dog while seven wizards quietly hex "
         "bread flour water salt yeast oven hours rise bake crust crumb").split()


def resident_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for {pid}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench gateway_memory", description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, default=None)
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--pythonpath", default=None, help="run the processes on another checkout's code")
    args = parser.parse_args(argv)
    model = args.model or default_cache_dir() / "multilingual-e5-small"
    env = dict(os.environ, OMP_NUM_THREADS="1")
    # ``python -m`` puts the working directory first on sys.path, so the other
    # checkout's code only runs when the processes start inside it.
    cwd = args.pythonpath
    if args.pythonpath:
        env["PYTHONPATH"] = args.pythonpath
    cli = [sys.executable, "-m", "embedserve.cli"]
    replica, banner = popen_listening([*cli, "scheduler", "--model", str(model), "--port", "0"],
                                      SCHEDULER_LISTENING, env=env, cwd=cwd)
    address = banner.group(1)
    gateway = None
    try:
        gateway, banner = popen_listening([*cli, "gateway", "--model", str(model), "--upstream", address,
                                           "--port", "0"], GATEWAY_LISTENING, env=env, cwd=cwd)
        url = banner.group(1)
        listening = resident_mb(gateway.pid)
        base = url
        deadline = time.monotonic() + 120
        while httpx.get(base + "/ready", timeout=10).status_code != 200:
            if time.monotonic() > deadline:
                raise RuntimeError("the gateway never became ready")
            time.sleep(0.2)
        ready = resident_mb(gateway.pid)
        rng = random.Random(0)
        with httpx.Client(base_url=base, timeout=120) as http:
            for _ in range(args.requests):
                texts = [" ".join(rng.choices(WORDS, k=rng.randint(3, 200))) for _ in range(rng.randint(1, 32))]
                response = http.post("/v1/embeddings", json={"input": texts})
                response.raise_for_status()
        served = resident_mb(gateway.pid)
        print(f"gateway VmRSS: listening {listening:.0f} MB, ready {ready:.0f} MB, "
              f"after {args.requests} requests {served:.0f} MB")
    finally:
        for process in (gateway, replica):
            if process is not None:
                stop_popen(process, 60)
    return 0


if __name__ == "__main__":
    sys.exit(main())
