"""EmbedOptions: how a bulk job embeds its documents (torch-free, so flags can be checked early).

Every field changes either a vector or the batches it is computed in, so the
whole dataclass is part of a job's recorded identity (``bulk/job.py``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from embedserve.errors import InvalidInput
from embedserve.scheduler.settings import default_max_batch_tokens

# Tokens per engine step of a bulk job on CPU (measured: BENCHMARKS.md, "Bulk embedding").
# A server's 512-token steps bound how long a query waits behind one; a bulk job has no such
# query, and fewer, larger steps pay the per-step and per-kernel costs (the threads' fork
# and join in every layer's kernels, Python) fewer times: on UDHR lines (~56 tokens) 4,096
# ran 1.2-1.5x the tokens/s of 512. Padded attention in one call per layer (instead of one
# per document) was tried for these short, length-sorted steps and measured slower.
BULK_CPU_TOKEN_BUDGET = 4096

LongInputPolicy = Literal["refuse", "truncate", "chunk"]
LONG_INPUT_POLICIES = ("refuse", "truncate", "chunk")


@dataclass(frozen=True)
class EmbedOptions:
    """Everything that decides a document's vector and its batch; part of a job's identity."""

    input_type: str | None = None        # a prompt name of the model ("query", "passage")
    dimensions: int | None = None        # Matryoshka cut
    precision: str = "float32"
    long_inputs: LongInputPolicy = "refuse"
    chunk_overlap: int = 0               # content tokens consecutive windows share (long_inputs "chunk")
    token_budget: int | None = None      # tokens per engine step (None: ``bulk_token_budget``)
    max_sequences: int = 256             # sequences per engine step
    window: int = 4096                   # documents sorted by length together
    top_k: int | None = None             # a sparse model: keep each document's top_k weights

    def __post_init__(self) -> None:
        if self.long_inputs not in LONG_INPUT_POLICIES:
            raise InvalidInput(f"long-input policy must be one of {', '.join(LONG_INPUT_POLICIES)}, "
                               f"got {self.long_inputs!r}", field="long_inputs")
        # The upper bound (the model's window less its specials) is checked where the model is known.
        if self.chunk_overlap < 0:
            raise InvalidInput(f"chunk_overlap must be >= 0, got {self.chunk_overlap}", field="chunk_overlap")
        if self.chunk_overlap and self.long_inputs != "chunk":
            raise InvalidInput("chunk_overlap applies only to the long-input policy chunk",
                               field="chunk_overlap")
        for name in ("max_sequences", "window"):
            if getattr(self, name) < 1:
                raise InvalidInput(f"{name} must be >= 1", field=name)
        if self.top_k is not None and self.top_k < 1:
            raise InvalidInput("top_k must be >= 1", field="top_k")
        if self.token_budget is not None and self.token_budget < 1:
            raise InvalidInput("token_budget must be >= 1", field="token_budget")


def bulk_token_budget(device: str) -> int:
    """Tokens per engine step of a bulk job when not given: larger than a server's on CPU."""
    return BULK_CPU_TOKEN_BUDGET if device == "cpu" else default_max_batch_tokens(device)
