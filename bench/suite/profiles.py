"""How big and how long each workload runs: the quick (CI), CPU and GPU profiles.

Owns the sizes of the four workloads and their time boxes. Every
measurement stops at ``*_requests`` requests or ``*_box_s`` seconds,
whichever comes first, but takes at least ``min_samples`` (a 50-document
rerank of 512-token pairs takes ~9 s on 2 CPU cores). The CPU profile is sized so
the whole suite stays near 15 minutes on 2 cores: 12.3 minutes measured with five
systems, about 16-17 estimated with the seven the default run measures (infinity's
bf16 and ONNX Runtime configurations add ~2 minutes each; the ONNX export adds ~4
minutes once); the GPU
profile so that two embedserve configurations plus sentence-transformers stay
under 8 minutes on one H200. Sizes above the model's position limit are
reported as not applicable rather than sent truncated.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Profile:
    name: str
    # 1. low-latency embeddings: batch 1, sequential
    latency_sizes: tuple[int, ...]
    latency_requests: int
    latency_box_s: float
    # 2. low-latency scoring: one query, N documents, pairs of rerank_pair_tokens
    rerank_docs: tuple[int, ...]
    rerank_pair_tokens: int
    rerank_requests: int
    rerank_box_s: float
    # 3. high-throughput embeddings: concurrent client processes, batches of texts
    throughput_sizes: tuple[int, ...]
    mixed_range: tuple[int, int] | None
    throughput_batch: int
    throughput_clients: int
    throughput_box_s: float
    throughput_pool: int
    # 4. high-concurrency embeddings: batch 1, N concurrent clients, through the gateway
    concurrency_tokens: int
    concurrency_levels: tuple[int, ...]
    concurrency_requests: int
    concurrency_box_s: float
    concurrency_pool: int
    min_samples: int = 2
    texts_per_size: int = 8


QUICK = Profile(
    name="quick",
    latency_sizes=(128,), latency_requests=8, latency_box_s=3.0,
    rerank_docs=(5,), rerank_pair_tokens=128, rerank_requests=4, rerank_box_s=3.0,
    throughput_sizes=(128,), mixed_range=None, throughput_batch=8, throughput_clients=4,
    throughput_box_s=1.0, throughput_pool=16,
    concurrency_tokens=128, concurrency_levels=(1, 4), concurrency_requests=12,
    concurrency_box_s=3.0, concurrency_pool=8, texts_per_size=4)

CPU = Profile(
    name="cpu",
    latency_sizes=(128, 512), latency_requests=100, latency_box_s=6.0,
    rerank_docs=(5, 25, 50), rerank_pair_tokens=512, rerank_requests=30, rerank_box_s=6.0,
    throughput_sizes=(512, 1024), mixed_range=(16, 512), throughput_batch=32, throughput_clients=4,
    throughput_box_s=6.0, throughput_pool=48,
    concurrency_tokens=512, concurrency_levels=(1, 2, 4, 8, 16), concurrency_requests=200,
    concurrency_box_s=5.0, concurrency_pool=16)

GPU = Profile(
    name="gpu",
    latency_sizes=(128, 512, 4096), latency_requests=300, latency_box_s=4.0,
    rerank_docs=(5, 25, 50), rerank_pair_tokens=512, rerank_requests=200, rerank_box_s=5.0,
    throughput_sizes=(512, 1024, 4096), mixed_range=(16, 512), throughput_batch=100,
    throughput_clients=4, throughput_box_s=6.0, throughput_pool=200,
    concurrency_tokens=512, concurrency_levels=(1, 2, 4, 8, 16), concurrency_requests=2000,
    concurrency_box_s=4.0, concurrency_pool=64)

PROFILES = {p.name: p for p in (QUICK, CPU, GPU)}
