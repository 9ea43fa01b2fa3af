"""What ``--dtype auto``'s probe costs at start: load time and resident memory per dtype.

``python -m bench dtype_load [--model DIR] [--rounds 2]``

Each load runs in a fresh process (as a replica starts), interleaved by dtype
so machine noise falls on all of them alike: ``auto`` (hardware rule + the
probe: tokenizer.json read, one float32 forward, the cast, one forward in the
candidate), then ``bfloat16`` and ``float32`` given explicitly (no probe).
Reported per load: wall and CPU seconds of ``load_engine``, resident memory
after it (VmRSS) and the process's peak (ru_maxrss), plus what auto chose.
The probe must not keep float32 weights resident: auto's RSS should sit
near explicit bfloat16's, not near float32 + bfloat16.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

_CHILD = """
import json, resource, sys, time
from pathlib import Path
from embedserve.scheduler.engine_loading import load_engine
wall, cpu = time.perf_counter(), time.process_time()
engine = load_engine(Path(sys.argv[1]), "cpu", sys.argv[2])
wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
rss = int(open("/proc/self/status").read().split("VmRSS:")[1].split()[0]) // 1024
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024
print(json.dumps({"dtype": engine.info.dtype, "reason": engine.info.dtype_reason, "wall_s": wall,
                  "cpu_s": cpu, "rss_mb": rss, "peak_mb": peak}))
engine.close()
"""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench dtype_load", description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, default=None, help="default: multilingual-e5-small")
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args(argv)
    from embedserve.defaults.build import ensure_default_model
    from embedserve.defaults.model_args import default_cache_dir

    model_dir = args.model or ensure_default_model(default_cache_dir())
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[1]))
    print(f"load average {os.getloadavg()[0]:.1f}; {model_dir.name}")
    print("| --dtype | chose | wall s | cpu s | RSS MB | peak MB |")
    print("|---|---|---:|---:|---:|---:|")
    reason = ""
    for _ in range(args.rounds):
        for dtype in ("auto", "bfloat16", "float32"):
            out = subprocess.run([sys.executable, "-c", _CHILD, str(model_dir), dtype], env=env,
                                 capture_output=True, text=True, check=True).stdout
            row = json.loads(out.strip().splitlines()[-1])
            reason = row["reason"] if dtype == "auto" else reason
            print(f"| {dtype} | {row['dtype']} | {row['wall_s']:.1f} | {row['cpu_s']:.1f} "
                  f"| {row['rss_mb']} | {row['peak_mb']} |", flush=True)
    print(f"\nauto chose: {reason}; load average {os.getloadavg()[0]:.1f}")
    return 0
