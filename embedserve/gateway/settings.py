"""Gateway settings: one frozen value built at the entry point and passed down.

Owns the knobs and their defaults, nothing else. Library code never reads the
environment or argv; ``embedserve gateway`` / ``embedserve serve`` build this
from flags (see ``cli.py``) and tests build it directly.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from embedserve.tracing import TracingSettings

# How a gateway may call its replicas' Embed/Score/Ranges (``replica_calls``).
REPLICA_CALLS = ("frames", "grpc")


@dataclass(frozen=True)
class ServedModel:
    """One model the gateway routes to: where to read it, its replicas, its names."""

    model_dir: Path
    upstreams: tuple[str, ...]
    served_model_names: tuple[str, ...] = ()

    @property
    def names(self) -> tuple[str, ...]:
        """Every name a request may ask for, the canonical one first."""
        return self.served_model_names or (self.model_dir.resolve().name,)


@dataclass(frozen=True)
class GatewaySettings:
    # The first (default) model. Its directory is read for the tokenizer and
    # the sentence-transformers metadata (prompts, normalization); the weights
    # stay with the replicas.
    model_dir: Path
    # host:port of each scheduler replica of the first model.
    upstreams: tuple[str, ...]
    # Names a request's ``model`` may use for the first model: the first is
    # the one answers carry, the rest are aliases. Empty: the model
    # directory's own name (a symlink such as /models/default is followed to
    # the directory it names).
    served_model_names: tuple[str, ...] = ()
    # Further models served beside the first, each with its own replicas,
    # tokenizer, token budget and names; requests pick one by ``model``.
    additional_models: tuple[ServedModel, ...] = ()
    host: str = "127.0.0.1"
    port: int = 8000
    # The public gRPC API (embedserve.v1.Embeddings, gateway/grpc_server.py) on this
    # port of ``host``; None: off, 0: any free port (printed in its banner).
    grpc_port: int | None = None
    # Bearer key required on the API routes; None turns authentication off.
    api_key: str | None = None
    # Further bearer keys, accepted beside ``api_key``, whose requests always run in
    # the batch class (docs/priority.md): a re-indexing job's key cannot slow the
    # online queries, whatever it sends. Kept out of repr so logs never show them.
    batch_api_keys: tuple[str, ...] = field(default=(), repr=False)
    # Routes whose requests always run in one class, {"/embed": "batch"}
    # (``--route-priority``); the others take the request's own class.
    route_priorities: dict[str, str] = field(default_factory=dict)
    # Inputs per request. OpenAI allows 2,048; thousands are served here, and
    # beyond this the request is refused with 413 rather than queued for minutes.
    max_inputs: int = 8192
    # Request bodies above this get 413 before they are parsed, and gRPC request
    # messages above it RESOURCE_EXHAUSTED. Large enough for a 10 MB string sent
    # with truncate=true.
    max_body_bytes: int = 32 * 1024 * 1024
    # Inputs longer than the model's window, unless a request's ``truncate``
    # says otherwise (``--auto-truncate``, TEI's flag): "refuse" (413),
    # "right" / "left" (cut to the window, specials kept) or "chunk" (embed
    # windows of the model's length, pool them weighted by their tokens).
    auto_truncate: str = "refuse"
    # Content tokens consecutive windows share under "chunk": context across a
    # cut, at the price of embedding those tokens twice (request: chunk_overlap).
    chunk_overlap: int = 0
    # Tokens admitted into dispatch at once across all requests, per served
    # model and per class (each model has its own budgets, so a flood of
    # reranking cannot starve embedding; each class too, so a bulk job filling
    # the batch budget never makes an interactive request get 429); a request
    # that does not fit gets 429 + Retry-After instead of waiting in memory.
    max_inflight_tokens: int = 4 * 1024 * 1024
    # Seconds to wait after a 429 before retrying (the Retry-After header).
    retry_after_s: int = 1
    # A request's deadline for queueing and inference (from the end of tokenization).
    request_timeout_s: float = 60.0
    # Chunk bounds: small enough that several replicas share one large request,
    # large enough that the per-call overhead stays small.
    chunk_max_sequences: int = 64
    chunk_max_tokens: int = 8192
    # Tokens outstanding per replica before further chunks wait in the gateway
    # (capped by the replica's own max_queue_tokens when it reports one).
    replica_max_outstanding_tokens: int = 65536
    # Attempts per chunk across replicas when a replica fails mid-call.
    max_attempts_per_chunk: int = 4
    # Threads for tokenization. One by default: the Numba encoder already
    # parallelises over texts inside a call, and its default threading layer
    # must not be entered from two threads at once.
    tokenizer_threads: int = 1
    # Seconds between HTTP/2 pings to each replica, and how long one may go
    # unanswered before the replica counts as hung and its calls are retried
    # elsewhere (0: no pings; a hung replica then holds calls to the deadline).
    # Its TCP frame connections get kernel keepalive probes at the same period.
    replica_ping_s: float = 2.0
    # How Embed/Score/Ranges reach a replica: "frames" (its frame socket beside a
    # ``unix:`` address or on the TCP port its Info names, embedserve/link/frames.py; gRPC
    # while none is open) or "grpc".
    replica_calls: str = "frames"
    # After SIGTERM: how long requests admitted before it may run on while new
    # ones get 503. The process exits once they are answered or this runs out;
    # 25 s leaves room to close under Kubernetes' and compose's default 30 s grace.
    drain_timeout_s: float = 25.0
    # Health-watch reconnect backoff bounds, in seconds.
    health_backoff_min_s: float = 0.1
    health_backoff_max_s: float = 2.0
    # Sent as ``authorization: Bearer <token>`` on every replica call
    # (embedserve/link/auth.py); None: replicas that require one refuse the
    # gateway. Kept out of repr so logs never show it.
    replica_token: str | None = field(default=None, repr=False)
    # (replica label, http://HOST:PORT/metrics) of replicas whose Prometheus
    # metrics /metrics merges into its own, each sample labelled replica=LABEL:
    # ``embedserve serve``'s local replicas (elsewhere each is scraped itself).
    replica_metrics_urls: tuple[tuple[str, str], ...] = ()
    # OpenTelemetry export (docs/tracing.md); None: no tracing, nothing of it loaded.
    tracing: TracingSettings | None = None

    @property
    def models(self) -> tuple[ServedModel, ...]:
        """Every served model, the first (default) one first."""
        first = ServedModel(self.model_dir, self.upstreams, self.served_model_names)
        return (first, *self.additional_models)


def check_distinct_names(names: Sequence[Sequence[str]]) -> None:
    """ValueError when two served models answer to one name (``names``: each model's)."""
    taken: set[str] = set()
    for model_names in names:
        clash = taken.intersection(model_names)
        if clash:
            raise ValueError(f"two models are served under the name {sorted(clash)[0]!r}; "
                             "give each its own names (--model DIR:name=NAME)")
        taken.update(model_names)
