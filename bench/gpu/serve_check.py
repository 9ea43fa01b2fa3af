"""``python -m bench.gpu.serve_check``: one ``embedserve serve`` on the device, answering HTTP.

The whole stack (gateway, replica, engine) with a Qwen3-Embedding-shaped model at
the ``small`` scale and a byte-level BPE tokenizer (bench/gpu/models.py; served by
the ``tokenizers`` library, so nothing compiles). Checks that the served vectors
match sentence-transformers' on the same texts in float32 on the CPU (cosine), then
times short queries and a 32-text batch from a client. One JSON line per result in
``--out``/serve.jsonl. Needs the serving packages (scripts/gpu-wheelhouse.sh).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from bench.gpu.models import write_model

TEXTS = ["how do I bake bread?", "The quick brown fox jumps over the lazy dog.",
         "Sentence embeddings map text to vectors; cosine similarity compares them."]
MIN_COSINE = 0.99        # bf16 on the device against float32 on the CPU


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.gpu.serve_check", description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--dry-run", action="store_true", help="tiny model, few requests")
    parser.add_argument("--out", type=Path, default=Path("bench/out/gpu"))
    args = parser.parse_args(argv)
    import httpx
    from sentence_transformers import SentenceTransformer

    from embedserve.entrypoint import GATEWAY_LISTENING
    from embedserve.launch.processes import popen_listening, stop_popen

    args.out.mkdir(parents=True, exist_ok=True)
    results = (args.out / "serve.jsonl").open("a")

    def write(**row: object) -> None:
        results.write(json.dumps(row) + "\n")
        results.flush()
        print(json.dumps(row), flush=True)

    with tempfile.TemporaryDirectory(prefix="embedserve-gpu-serve-") as scratch:
        model_dir = write_model(Path(scratch) / "qwen3", "qwen3-embedding-0.6b", "tiny" if args.dry_run else "small")
        reference = SentenceTransformer(str(model_dir), device="cpu", local_files_only=True).encode(TEXTS)
        started = time.monotonic()
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        process, match = popen_listening(
            [sys.executable, "-m", "embedserve.cli", "serve", "--port", "0", "--replicas", "1",
             "--model", f"{model_dir}:name=qwen3", "--device", args.device], GATEWAY_LISTENING, env=env)
        try:
            url = match.group(1)
            with httpx.Client(base_url=url, timeout=120) as client:
                while client.get("/ready").status_code != 200:
                    time.sleep(0.2)
                write(check="ready", seconds=time.monotonic() - started)
                reply = client.post("/v1/embeddings", json={"input": TEXTS, "model": "qwen3"})
                reply.raise_for_status()
                served = np.array([row["embedding"] for row in reply.json()["data"]])
                cosines = (served * reference).sum(1) / (np.linalg.norm(served, axis=1) *
                                                         np.linalg.norm(reference, axis=1))
                write(check="vectors vs sentence-transformers (cpu fp32)", min_cosine=float(cosines.min()),
                      passed=bool(cosines.min() >= MIN_COSINE))
                runs = 5 if args.dry_run else 100
                for label, body in (("1 short query", {"input": TEXTS[0], "model": "qwen3"}),
                                    ("32 texts", {"input": TEXTS * 11, "model": "qwen3"})):
                    times = []
                    for _ in range(runs):
                        begun = time.perf_counter()
                        client.post("/v1/embeddings", json=body).raise_for_status()
                        times.append((time.perf_counter() - begun) * 1e3)
                    times.sort()
                    write(check=f"latency, {label}", p50_ms=statistics.median(times),
                          p99_ms=times[min(len(times) - 1, int(0.99 * len(times)))], runs=runs)
                failed = cosines.min() < MIN_COSINE
        finally:
            write(check="stopped", exit_status=stop_popen(process, 60))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
