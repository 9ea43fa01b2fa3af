"""How a model runs on CUDA: the CUDA runner's options (torch-free, so entry points parse them)."""

from __future__ import annotations

from dataclasses import dataclass

ATTENTION_CHOICES = ("auto", "varlen", "padded")


@dataclass(frozen=True)
class CudaOptions:
    """attention: "auto" (the varlen kernel where it covers the dtype), "varlen" or
    "padded" (the static masked layouts). graph_tokens / graph_sequences: the
    largest step that gets a graph, the replica's step budget, so that every
    reachable bucket fits the cache. max_graphs: the most graphs kept (None:
    one per reachable bucket). graph_memory_bytes: a cap on the graphs'
    device memory (None: none). capture_at_start: capture every reachable
    bucket before the replica reports SERVING (default: lazily, on a bucket's
    second step)."""

    attention: str = "auto"
    graph_tokens: int = 512
    graph_sequences: int = 256
    max_graphs: int | None = None
    graph_memory_bytes: int | None = None
    capture_at_start: bool = False
