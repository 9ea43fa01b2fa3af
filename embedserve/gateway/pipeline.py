"""The gateway's work for one request to one served model, independent of the HTTP shape.

Owns admission (input count, the model's in-flight token budget of the
request's priority class: one budget per class, so a bulk job filling its own
never refuses an interactive request), the deadline, handing packed tokens to
the dispatcher, recording timings and metrics, and cancelling the work when
the client disconnects. A ``Gateway``
serves one model (its tokenizer, replica pool, budget and names); which one
a request goes to is ``routing.py``'s. Routes translate their JSON into
calls on ``Gateway`` and its answers back into JSON.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable
from typing import TypeVar

import numpy as np
from starlette.requests import Request

from embedserve import validate
from embedserve.errors import Cancelled, InputTooLong, InvalidInput, ModelNotFound, Unavailable
from embedserve.gateway.budget import TokenBudget
from embedserve.gateway.dispatch import ChunkPolicy, DispatchTimings, run_chunks_outputs
from embedserve.gateway.metrics import GatewayMetrics
from embedserve.gateway.middleware import REQUEST_ID_KEY, TIMING_KEY, TRACE_KEY
from embedserve.gateway.preprocess import Preprocessor
from embedserve.gateway.priority import scope_priority
from embedserve.gateway.replicas import REPLICA_CALL_ERRORS, ReplicaPool
from embedserve.gateway.settings import GatewaySettings
from embedserve.link import wire
from embedserve.link.status import from_replica_error
from embedserve.link.wire import INTERACTIVE, PRIORITIES
from embedserve.model import tasks
from embedserve.model.info import ModelInfo
from embedserve.protos import inference_pb2
from embedserve.ragged import RaggedBatch

T = TypeVar("T")

# A transport may set this scope key to a time.monotonic() deadline of its own (the
# gRPC API: the client's deadline); a request's deadline is the sooner of it and
# the server's --request-timeout.
DEADLINE_KEY = "embedserve.deadline"

# How a task's model is named in messages (model/tasks.py).
TASK_NAMES = tasks.TASK_NAMES


class Gateway:
    def __init__(self, settings: GatewaySettings, model: ModelInfo, preprocessor: Preprocessor,
                 pool: ReplicaPool, metrics: GatewayMetrics,
                 names: tuple[str, ...] | None = None) -> None:
        self.settings = settings
        self._described = model
        # Every name a request may ask for, the canonical one first (default:
        # the first model's names in ``settings``).
        self._names = names or settings.models[0].names
        self.preprocessor = preprocessor
        self.pool = pool
        self.metrics = metrics
        # One budget per priority class (docs/priority.md); ``budget`` is the default class's.
        self.budgets = {priority: TokenBudget(settings.max_inflight_tokens, settings.retry_after_s)
                        for priority in PRIORITIES}
        self.budget = self.budgets[INTERACTIVE]
        budgets = self.budgets
        # Read when scraped, not written twice per request.
        metrics.inflight_tokens.labels(self.model_id).set_function(
            lambda: sum(budget.in_use for budget in budgets.values()))
        for priority, budget in budgets.items():
            metrics.class_inflight_tokens.labels(self.model_id, priority).set_function(
                lambda b=budget: b.in_use)  # type: ignore[misc]  # a bound default
        self._class_queue = {priority: metrics.class_queue.labels(priority)
                             for priority in PRIORITIES}
        self._count_retry = metrics.chunk_retries.labels(self.model_id).inc
        metrics.model_task.labels(self.model_id, model.task).set(1)
        self.policy = ChunkPolicy(settings.chunk_max_sequences, settings.chunk_max_tokens,
                                  settings.max_attempts_per_chunk)
        # The last replica report read and the ModelInfo made of it: a request reads
        # ``model`` a few times, and a replica's Info changes only when it restarts.
        self._merged: tuple[inference_pb2.InfoResponse, ModelInfo] | None = None

    @property
    def model(self) -> ModelInfo:
        """The served model: the directory's description, a healthy replica's report over it."""
        reply = self.pool.info()
        if reply is None:
            return self._described
        merged = self._merged
        if merged is None or merged[0] is not reply:
            merged = self._merged = (reply, wire.model_info_from_proto(reply, self._described))
        return merged[1]

    @property
    def served_names(self) -> tuple[str, ...]:
        """Every name a request may ask for, the canonical one first."""
        return self._names

    @property
    def model_id(self) -> str:
        return self.served_names[0]

    @property
    def task(self) -> str:
        """What the model does: "embed", "score", "classify", "sparse" or "multivector"
        (model/tasks.py)."""
        return self._described.task

    def check_model(self, name: str | None) -> str:
        """The name an answer carries: the one asked for, or the canonical one when none was."""
        if name is None:
            return self.model_id
        if name not in self.served_names:
            raise ModelNotFound(name)
        return name

    def check_count(self, count: int, field: str) -> None:
        if count > self.settings.max_inputs:
            raise InputTooLong(f"{field} has {count} inputs; at most {self.settings.max_inputs} "
                               "are accepted per request: send them in several requests, or "
                               "start the server with a larger --max-inputs", length=count,
                               limit=self.settings.max_inputs, field=field)

    def check_dimensions(self, dimensions: int | None, field: str = "dimensions") -> int:
        if dimensions is None:
            return 0
        validate.check_dimensions(dimensions, self._described.dimension, field)
        return dimensions

    def require_task(self, task: str) -> None:
        if not tasks.answers(self._described.task, task):
            hint = (" (send \"sparse\": true for its sparse vectors)"
                    if self.task == "sparse" and task == "embed" else "")
            raise InvalidInput(f"this route needs {TASK_NAMES[task]}; the model `{self.model_id}` "
                               f"is {TASK_NAMES[self.task]} (task `{self.task}`) and cannot "
                               f"{tasks.TASK_VERBS[task]}{hint}", field="model")

    async def embed(self, request: Request, packed: RaggedBatch, normalize: bool, dimensions: int,
                    route: str) -> np.ndarray:
        """Pooled vectors [B, d] for ``packed``, in input order."""
        def make(tokens: inference_pb2.PackedTokens) -> inference_pb2.EmbedRequest:
            return inference_pb2.EmbedRequest(tokens=tokens, normalize=normalize, dimensions=dimensions,
                                              dtype=inference_pb2.DTYPE_FLOAT32,
                                              request_id=request.scope.get(REQUEST_ID_KEY, ""))
        return (await self._dispatch(request, packed, "Embed", make, route))[0]

    async def embed_quantized(self, request: Request, packed: RaggedBatch, normalize: bool,
                              dimensions: int, precisions: list[str], route: str) -> list[np.ndarray]:
        """The vectors in each of ``precisions`` (embedserve.model.quantize), in input order;
        the replicas quantize them."""
        wire_precisions = wire.precisions_to_proto(precisions)

        def make(tokens: inference_pb2.PackedTokens) -> inference_pb2.EmbedRequest:
            return inference_pb2.EmbedRequest(tokens=tokens, normalize=normalize, dimensions=dimensions,
                                              precisions=wire_precisions,  # type: ignore[arg-type]  # Precision values
                                              request_id=request.scope.get(REQUEST_ID_KEY, ""))
        return await self._dispatch(request, packed, "Embed", make, route)

    async def ranges(self, dimensions: int, normalize: bool) -> inference_pb2.RangesResponse:
        """The int8/uint8 calibration ranges of a healthy replica (all share one calibration
        when they share a cache directory; see embedserve/calibration.py)."""
        healthy = self.pool.healthy()
        if not healthy:
            raise Unavailable("no replica is ready")
        try:
            return await healthy[0].call(
                "Ranges", inference_pb2.RangesRequest(dimensions=dimensions, normalize=normalize),
                self.settings.request_timeout_s, "")
        except REPLICA_CALL_ERRORS as exc:
            raise from_replica_error(exc) from None

    async def score(self, request: Request, packed: RaggedBatch, sigmoid: bool, route: str) -> np.ndarray:
        """One score [B] per packed pair, in input order."""
        def make(tokens: inference_pb2.PackedTokens) -> inference_pb2.ScoreRequest:
            return inference_pb2.ScoreRequest(pairs=tokens, sigmoid=sigmoid,
                                              request_id=request.scope.get(REQUEST_ID_KEY, ""))
        return (await self._dispatch(request, packed, "Score", make, route))[0]

    async def classify(self, request: Request, packed: RaggedBatch, raw_scores: bool,
                       route: str) -> np.ndarray:
        """Per-label scores [B, labels] per packed input (probabilities unless
        ``raw_scores``), in input order."""
        def make(tokens: inference_pb2.PackedTokens) -> inference_pb2.ClassifyRequest:
            return inference_pb2.ClassifyRequest(tokens=tokens, raw_scores=raw_scores,
                                                 request_id=request.scope.get(REQUEST_ID_KEY, ""))
        return (await self._dispatch(request, packed, "Classify", make, route))[0]

    async def embed_sparse(self, request: Request, packed: RaggedBatch, top_k: int | None,
                           route: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Each input's nonzero SPLADE weights: counts [B], indices [N], values [N]."""
        def make(tokens: inference_pb2.PackedTokens) -> inference_pb2.EmbedSparseRequest:
            return inference_pb2.EmbedSparseRequest(tokens=tokens, top_k=top_k or 0,
                                                    request_id=request.scope.get(REQUEST_ID_KEY, ""))
        counts, indices, values = await self._dispatch(request, packed, "EmbedSparse", make, route)
        return counts, indices, values

    async def embed_tokens(self, request: Request, packed: RaggedBatch, query: bool,
                           route: str) -> tuple[np.ndarray, np.ndarray]:
        """Each input's token vectors (multi-vector model): counts [B], vectors [N, dim]."""
        def make(tokens: inference_pb2.PackedTokens) -> inference_pb2.EmbedTokensRequest:
            return inference_pb2.EmbedTokensRequest(tokens=tokens, query=query,
                                                    request_id=request.scope.get(REQUEST_ID_KEY, ""))
        counts, vectors = await self._dispatch(request, packed, "EmbedTokens", make, route)
        return counts, vectors

    async def _dispatch(self, request: Request, packed: RaggedBatch, rpc: str, make,
                        route: str) -> list[np.ndarray]:
        """Send ``packed`` in the request's priority class (``priority.scope_priority``): its
        budget, its room on the replicas, and the class named in every replica call."""
        tokens = packed.num_tokens
        timing = request.scope.setdefault(TIMING_KEY, {})
        timings = DispatchTimings()
        deadline = time.monotonic() + self.settings.request_timeout_s
        deadline = min(deadline, request.scope.get(DEADLINE_KEY, deadline))
        started = time.perf_counter()
        priority = scope_priority(request.scope, self.settings.route_priorities)
        wire_priority = wire.priority_to_proto(priority)

        def make_in_class(tokens: inference_pb2.PackedTokens):
            message = make(tokens)
            message.priority = wire_priority
            return message
        trace = request.scope.get(TRACE_KEY)
        if trace is not None:   # docs/tracing.md
            trace.set_attributes({"embedserve.model": self.model_id, "embedserve.route": route,
                                  "embedserve.priority": priority, "embedserve.rpc": rpc,
                                  "embedserve.sequences": packed.num_sequences,
                                  "embedserve.tokens": tokens})
        with self.budgets[priority].hold(tokens):
            try:
                result = await cancel_on_disconnect(request, run_chunks_outputs(
                    self.pool, packed, self.policy, rpc, make_in_class, deadline,
                    request.scope.get(REQUEST_ID_KEY, ""), timings,
                    on_retry=self._count_retry, priority=priority, trace=trace))
                self._class_queue[priority].observe(timings.queue_s)
            finally:
                timing["dispatch"] = time.perf_counter() - started - timings.rpc_s
                timing["rpc"] = timings.rpc_s
                timing["replica"] = timings.replica_s
                timing["queue"] = timings.queue_s
                timing["wake"] = timings.wake_s
                timing["inference"] = timings.inference_s
        self.metrics.count_work(route, self.model_id, packed.num_sequences, tokens)
        return result


async def timed(request: Request, phase: str, work: Awaitable[T]) -> T:
    """Await ``work`` and record its duration as ``phase`` in Server-Timing (and as a span,
    when the request is traced)."""
    trace = request.scope.get(TRACE_KEY)
    started_ns = time.time_ns() if trace is not None else 0
    started = time.perf_counter()
    try:
        return await work
    finally:
        timing = request.scope.setdefault(TIMING_KEY, {})
        timing[phase] = timing.get(phase, 0.0) + time.perf_counter() - started
        if trace is not None:
            trace.phase(phase, started_ns)


async def cancel_on_disconnect(request: Request, work: Awaitable[T]) -> T:
    """Run ``work``; cancel it (and its replica calls) if the client disconnects."""
    task = asyncio.ensure_future(work)
    client_left = False

    async def client_gone() -> None:
        nonlocal client_left
        while (await request.receive())["type"] != "http.disconnect":
            pass
        client_left = True
        task.cancel()

    watcher = asyncio.ensure_future(client_gone())
    try:
        # Awaited directly (no asyncio.wait): a request whose own task is cancelled
        # cancels ``task`` through this await.
        return await task
    except asyncio.CancelledError:
        if client_left and not _being_cancelled():
            raise Cancelled("the client disconnected") from None
        raise
    finally:
        watcher.cancel()


def _being_cancelled() -> bool:
    """Whether the running task itself has been asked to stop (not only the work it awaited)."""
    current = asyncio.current_task()
    return current is not None and current.cancelling() > 0
