"""Gateway benchmark: what HTTP + tokenize + gRPC + batching add to one request.

    python -m bench.gateway_bench [--iterations 300] [--model DIR]

Runs ``embedserve scheduler`` (one replica, default model, CPU) and
``embedserve gateway`` as real subprocesses, and in this process loads the
same model into an ``Engine``. For a batch-1 request of exactly 128 tokens
(specials included) it measures, interleaved in blocks so background load
hits both alike:

- p50 of ``POST /v1/embeddings`` (text in, JSON floats out) over keep-alive HTTP,
- p50 of ``Engine.step(...).wait()`` in-process on the same 128 token ids,

and reports the difference (target: <= 2 ms) plus the gateway's own
Server-Timing medians (tokenize, queue, inference, total).
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
import time
from pathlib import Path

import httpx
import numpy as np

from embedserve.defaults.build import ensure_default_model
from embedserve.defaults.model_args import default_cache_dir
from embedserve.engine import Batch, Engine
from embedserve.entrypoint import GATEWAY_LISTENING, SCHEDULER_LISTENING
from embedserve.launch.processes import popen_listening
from embedserve.tokenizer import TokenizerBackend, load_tokenizer

ROOT = Path(__file__).resolve().parent.parent
TEXT_SOURCE = ROOT.parent / "shared" / "data" / "text" / "botchan.txt"


def text_of_tokens(tokenizer: TokenizerBackend, words: list[str], target: int) -> str:
    """The shortest prefix of ``words`` that encodes to exactly ``target`` tokens, if any."""
    for count in range(1, len(words)):
        text = " ".join(words[:count])
        length = len(tokenizer.encode(text))
        if length == target:
            return text
        if length > target:
            break
    raise ValueError(f"no prefix encodes to exactly {target} tokens")


def p50(samples: list[float]) -> float:
    return float(np.median(samples))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iterations", type=int, default=300)
    parser.add_argument("--model", type=Path, default=None)
    args = parser.parse_args(argv)
    model_dir = args.model or ensure_default_model(default_cache_dir())
    tokenizer = load_tokenizer(model_dir)
    words = TEXT_SOURCE.read_text(encoding="utf-8").split() if TEXT_SOURCE.exists() else \
        ("the quick brown fox jumps over the lazy dog " * 40).split()
    text = text_of_tokens(tokenizer, words[200:], 128)
    ids = tokenizer.encode(text)
    assert len(ids) == 128

    load_before = os.getloadavg()[0]
    python = [sys.executable, "-m", "embedserve.cli"]
    scheduler, banner = popen_listening([*python, "scheduler", "--model", str(model_dir), "--port", "0"],
                                        SCHEDULER_LISTENING)
    replica = banner.group(1)
    gateway, banner = popen_listening([*python, "gateway", "--upstream", replica, "--model", str(model_dir),
                                       "--port", "0", "--log-level", "warning"], GATEWAY_LISTENING)
    url = banner.group(1)
    engine = Engine.load(model_dir, device="cpu")
    batch = Batch.from_sequences([ids])
    http_ms: list[float] = []
    minus_compute_ms: list[float] = []
    health_ms: list[float] = []
    step_ms: list[float] = []
    phases: dict[str, list[float]] = {}
    try:
        # TCP_NODELAY: httpx writes headers and body separately, and Nagle plus
        # the server's delayed ACK would add ~40 ms that no server can remove.
        transport = httpx.HTTPTransport(socket_options=[(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)])
        with httpx.Client(base_url=url, timeout=60, transport=transport) as client:
            for _ in range(20):  # warm both paths
                client.post("/v1/embeddings", json={"input": text}).raise_for_status()
                engine.step(batch).wait()
            for _ in range(max(1, args.iterations // 10)):
                for _ in range(10):
                    started = time.perf_counter()
                    response = client.post("/v1/embeddings", json={"input": text})
                    http_ms.append((time.perf_counter() - started) * 1e3)
                    response.raise_for_status()
                    timing = {}
                    for part in response.headers["server-timing"].split(","):
                        name, _, value = part.strip().partition(";dur=")
                        timing[name] = float(value)
                        phases.setdefault(name, []).append(float(value))
                    minus_compute_ms.append(http_ms[-1] - timing["inference"])
                for _ in range(10):
                    started = time.perf_counter()
                    client.get("/health").raise_for_status()
                    health_ms.append((time.perf_counter() - started) * 1e3)
                for _ in range(10):
                    started = time.perf_counter()
                    engine.step(batch).wait()
                    step_ms.append((time.perf_counter() - started) * 1e3)
    finally:
        engine.close()
        for process in (gateway, scheduler):
            process.terminate()
            process.wait(30)
    print(f"gateway overhead, batch 1 x 128 tokens, {len(http_ms)} requests, CPU, model {model_dir.name}, "
          f"load average {load_before:.2f} before, {os.getloadavg()[0]:.2f} after")
    print("| measurement | p50 ms |")
    print("|---|---|")
    print(f"| POST /v1/embeddings over HTTP (client-side) | {p50(http_ms):.2f} |")
    print(f"| Engine.step in-process, same 128 ids | {p50(step_ms):.2f} |")
    print(f"| GET /health over HTTP (client-side; HTTP alone) | {p50(health_ms):.2f} |")
    print(f"| **overhead** (HTTP p50 - engine p50) | **{p50(http_ms) - p50(step_ms):.2f}** |")
    print(f"| per request: HTTP wall - the replica's compute for it | {p50(minus_compute_ms):.2f} |")
    for name in ("tokenize", "queue", "inference", "total"):
        if name in phases:
            print(f"| Server-Timing {name} (gateway-side) | {p50(phases[name]):.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
