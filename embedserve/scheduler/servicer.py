"""The ``embedserve.v1.Inference`` servicer: Embed, Score, Classify, EmbedSparse, EmbedTokens and
Info over grpc.aio.

A thin layer over the pool: decode and validate a request, admit it as a
``Call``, await its rows, post-process them per call (Matryoshka dimensions,
normalization, sigmoid, output dtype, quantization with the replica's
calibration; a classifier's softmax or sigmoid; a SPLADE row's nonzeros, so
only those travel; a multi-vector model's kept, normalized token vectors) and encode the answer. Errors are
mapped to status codes in one place (``embedserve.link.status``); this module only
catches them at the handler boundary. Batching and the engine live in
``batcher.py``.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
from collections.abc import Awaitable, Callable
from dataclasses import replace
from typing import TYPE_CHECKING, TypeAlias

import grpc
import numpy as np

import embedserve
from embedserve import validate
from embedserve.calibration import Calibration
from embedserve.engine.batch import Task
from embedserve.errors import InvalidInput, Unavailable
from embedserve.link import wire
from embedserve.link.status import error_metadata, grpc_status
from embedserve.model.calibration_texts import TEXTS_ID
from embedserve.model.multivector import prepare_inputs
from embedserve.model.postprocess import (
    classification_probabilities,
    postprocess_embeddings,
    postprocess_scores,
    sparse_rows,
    token_vectors,
)
from embedserve.model.quantize import RANGED_PRECISIONS, quantize
from embedserve.protos import inference_pb2, inference_pb2_grpc
from embedserve.ragged import RaggedBatch
from embedserve.scheduler.batcher import StepEngine
from embedserve.scheduler.metrics import SchedulerMetrics
from embedserve.scheduler.pool import CANCELLED, DEADLINE, Call, RequestPool
from embedserve.scheduler.settings import SchedulerSettings

if TYPE_CHECKING:
    from embedserve.otel import CallTrace, Tracer

log = logging.getLogger(__name__)
# grpc ships no types: an explicit alias (of Any) that annotations may use.
Context: TypeAlias = grpc.aio.ServicerContext
# The RPC that serves each task: the name of a traced call's span (docs/tracing.md).
TASK_METHODS = {"embed": "Embed", "score": "Score", "classify": "Classify", "sparse": "EmbedSparse",
                "multivector": "EmbedTokens"}


class InferenceService(inference_pb2_grpc.InferenceServicer):
    """Handlers for one engine. ``accepting`` is False while warming up and draining."""

    def __init__(self, engine: StepEngine, pool: RequestPool, settings: SchedulerSettings,
                 metrics: SchedulerMetrics, tracer: Tracer | None = None) -> None:
        self._engine = engine
        self._tracer = tracer   # None: no tracing (docs/tracing.md)
        self._info = engine.info
        self._pool = pool
        self._settings = settings
        self._metrics = metrics
        self.accepting = False
        self.calibration: Calibration | None = None
        self.calibration_error = "this replica runs without a calibration (no cache directory)"
        self.active_calls = 0
        self.frame_port = 0   # the frame socket's TCP port once it listens (0: none)
        self.instance_id = secrets.token_hex(8)
        # The largest Embed reply's vectors, in bytes (the transports' send limit, set by
        # server.py); a call whose reply would be larger is refused before any compute.
        self.max_reply_bytes: int | None = None
        self._idle = asyncio.Event()
        self._idle.set()

    async def Embed(self, request: inference_pb2.EmbedRequest,
                    context: Context) -> inference_pb2.EmbedResponse:
        return await self._answer("Embed", context, lambda: self._embed(request, context))

    async def Score(self, request: inference_pb2.ScoreRequest,
                    context: Context) -> inference_pb2.ScoreResponse:
        return await self._answer("Score", context, lambda: self._score(request, context))

    async def Classify(self, request: inference_pb2.ClassifyRequest,
                       context: Context) -> inference_pb2.ClassifyResponse:
        return await self._answer("Classify", context, lambda: self._classify(request, context))

    async def EmbedTokens(self, request: inference_pb2.EmbedTokensRequest,
                          context: Context) -> inference_pb2.EmbedTokensResponse:
        return await self._answer("EmbedTokens", context, lambda: self._embed_tokens(request, context))

    async def EmbedSparse(self, request: inference_pb2.EmbedSparseRequest,
                          context: Context) -> inference_pb2.EmbedSparseResponse:
        return await self._answer("EmbedSparse", context, lambda: self._embed_sparse(request, context))

    async def Ranges(self, request: inference_pb2.RangesRequest,
                     context: Context) -> inference_pb2.RangesResponse:
        return await self._answer("Ranges", context, lambda: self._ranges(request))

    def set_calibration(self, calibration: Calibration) -> None:
        """Quantize int8/uint8 with ``calibration`` and report it in Info."""
        self.calibration = calibration
        self._info = replace(self._info, calibration_id=calibration.calibration_id,
                             calibration_sample_size=calibration.sample_size,
                             calibration_texts_id=TEXTS_ID)

    async def Info(self, request: inference_pb2.InfoRequest,
                   context: Context) -> inference_pb2.InfoResponse:
        s = self._settings
        assert s.max_batch_tokens is not None   # resolved by SchedulerServer before this service
        reply = wire.model_info_to_proto(self._info, max_batch_tokens=s.max_batch_tokens,
                                         max_batch_sequences=s.max_batch_sequences,
                                         max_queue_tokens=s.max_queue_tokens,
                                         version=embedserve.__version__)
        reply.frame_port = self.frame_port
        reply.instance_id = self.instance_id
        return reply

    def count_cancelled_before_start(self, method: str) -> None:
        """A call cancelled by its client before its handler began (it arrived while the
        loop computed a step): dropped before compute, counted as a handled one would be."""
        self._metrics.calls_dropped.labels(CANCELLED).inc()
        self._metrics.count_call(method, grpc.StatusCode.CANCELLED.name)

    async def wait_idle(self) -> None:
        """Return once no Embed/Score call is being served."""
        await self._idle.wait()

    async def _embed(self, request: inference_pb2.EmbedRequest,
                     context: Context) -> inference_pb2.EmbedResponse:
        tokens = self._decode(request.tokens, "embed", "tokens")
        dimensions = request.dimensions or None
        if dimensions is not None:
            validate.check_dimensions(dimensions, self._info.dimension)
        if request.dtype not in (inference_pb2.DTYPE_FLOAT32, inference_pb2.DTYPE_FLOAT16):
            raise InvalidInput(f"unknown output dtype {request.dtype}", field="dtype")
        precisions = wire.precisions_from_proto(request.precisions)
        self._check_reply_size(tokens.num_sequences, dimensions or self._info.dimension,
                               precisions, request.dtype)
        ranged = any(p in RANGED_PRECISIONS for p in precisions)
        if ranged:
            self._require_calibration()
        call, rows = await self._run(tokens, "embed", context, request.priority, request.trace)
        vectors = postprocess_embeddings(rows, request.normalize, dimensions)
        if not precisions:
            return inference_pb2.EmbedResponse(
                embeddings=wire.array_to_tensor(vectors, request.dtype),
                timings=self._timings(call), request_id=request.request_id)
        # Quantized after truncation and normalization, with ranges calibrated on
        # vectors post-processed the same way.
        ranges = self._require_calibration().ranges(dimensions, request.normalize) if ranged else None
        quantized = [quantize(vectors, p, ranges) for p in precisions]
        return inference_pb2.EmbedResponse(
            quantized=[wire.array_to_tensor(q, q.dtype.name) for q in quantized],
            timings=self._timings(call), request_id=request.request_id)

    async def _ranges(self, request: inference_pb2.RangesRequest) -> inference_pb2.RangesResponse:
        dimensions = request.dimensions or None
        if dimensions is not None:
            validate.check_dimensions(dimensions, self._info.dimension)
        calibration = self._require_calibration()
        ranges = calibration.ranges(dimensions, request.normalize)
        return inference_pb2.RangesResponse(ranges=wire.array_to_tensor(ranges, "float32"),
                                            calibration_id=calibration.calibration_id,
                                            sample_size=calibration.sample_size)

    def _check_reply_size(self, rows: int, width: int, precisions: list[str], dtype: int) -> None:
        """Refuse, before compute, a call whose reply would exceed the transports' limit
        (many rows in many precisions): the work would be done, then not sent."""
        if self.max_reply_bytes is None:
            return
        per_row = (sum(_row_bytes(p, width) for p in precisions) if precisions else
                   (2 if dtype == inference_pb2.DTYPE_FLOAT16 else 4) * width)
        if rows * per_row > self.max_reply_bytes:
            raise InvalidInput(f"the reply would be {rows * per_row} bytes, over this replica's "
                               f"limit of {self.max_reply_bytes}; send fewer sequences per call "
                               "or fewer precisions", field="precisions")

    def _require_calibration(self) -> Calibration:
        if self.calibration is None:
            raise InvalidInput(f"int8/uint8 need this replica's calibration: "
                               f"{self.calibration_error}", field="precisions")
        return self.calibration

    async def _score(self, request: inference_pb2.ScoreRequest,
                     context: Context) -> inference_pb2.ScoreResponse:
        tokens = self._decode(request.pairs, "score", "pairs")
        call, rows = await self._run(tokens, "score", context, request.priority, request.trace)
        scores = postprocess_scores(rows.reshape(-1), request.sigmoid)
        return inference_pb2.ScoreResponse(scores=wire.array_to_tensor(scores, "float32"),
                                           timings=self._timings(call),
                                           request_id=request.request_id)

    async def _classify(self, request: inference_pb2.ClassifyRequest,
                        context: Context) -> inference_pb2.ClassifyResponse:
        tokens = self._decode(request.tokens, "classify", "tokens")
        call, rows = await self._run(tokens, "classify", context, request.priority, request.trace)
        scores = rows if request.raw_scores else classification_probabilities(rows, self._info.activation)
        return inference_pb2.ClassifyResponse(scores=wire.array_to_tensor(scores, "float32"),
                                              timings=self._timings(call),
                                              request_id=request.request_id)

    async def _embed_sparse(self, request: inference_pb2.EmbedSparseRequest,
                            context: Context) -> inference_pb2.EmbedSparseResponse:
        tokens = self._decode(request.tokens, "sparse", "tokens")
        call, rows = await self._run(tokens, "sparse", context, request.priority, request.trace)
        counts, indices, values = sparse_rows(rows, request.top_k or None)
        return inference_pb2.EmbedSparseResponse(
            counts=wire.array_to_tensor(counts, "int32"), indices=wire.array_to_tensor(indices, "int32"),
            values=wire.array_to_tensor(values, "float32"), timings=self._timings(call),
            request_id=request.request_id)

    async def _embed_tokens(self, request: inference_pb2.EmbedTokensRequest,
                            context: Context) -> inference_pb2.EmbedTokensResponse:
        if self._info.task == "embed":
            return await self._embed_token_states(request, context)
        tokens = self._decode(request.tokens, "multivector", "tokens")
        spec = self._info.multivector
        assert spec is not None, "a multi-vector model's info carries its spec"
        task = "query" if request.query else "document"
        # A PyLate / Stanford-NLP folder's marker token inserted; ColBERT query expansion:
        # queries padded with the expansion token, which, unless attended, are nobody's
        # keys (engine/batch.py key_lengths).
        given = tokens
        tokens, key_lengths = prepare_inputs(tokens, spec, task)
        if tokens is not given:
            validate.check_fits_model(tokens, self._info, "tokens")
        self._check_reply_size(tokens.num_tokens, self._info.dimension, [], inference_pb2.DTYPE_FLOAT32)
        call, rows = await self._run(tokens, "multivector", context, request.priority, request.trace,
                                     key_lengths=key_lengths)
        counts, vectors = token_vectors(rows, tokens.token_ids, tokens.cu_seqlens, spec,
                                        self._info.normalize, task)
        return inference_pb2.EmbedTokensResponse(
            counts=wire.array_to_tensor(counts, "int32"), vectors=wire.array_to_tensor(vectors, "float32"),
            timings=self._timings(call), request_id=request.request_id)

    async def _embed_token_states(self, request: inference_pb2.EmbedTokensRequest,
                                  context: Context) -> inference_pb2.EmbedTokensResponse:
        """An embedding model's EmbedTokens: every token's last hidden state, specials
        included, with no pooling, normalization or Dense (TEI's /embed_all). Its step
        computes them for this call only; the other calls in it get their pooled rows."""
        tokens = self._decode(request.tokens, "embed", "tokens")
        if self._info.device not in (None, "cpu"):
            raise InvalidInput("token states (/embed_all for an embedding model) are computed on the CPU "
                               "only so far; serve the model with --device cpu for them", field="tokens")
        call, rows = await self._run(tokens, "embed", context, request.priority, request.trace,
                                     token_states=True)
        vectors = np.concatenate(list(rows), axis=0).astype(np.float32, copy=False)
        # The width (hidden size) is known once computed: a Dense may make it differ from dimension.
        self._check_reply_size(vectors.shape[0], vectors.shape[1], [], inference_pb2.DTYPE_FLOAT32)
        return inference_pb2.EmbedTokensResponse(
            counts=wire.array_to_tensor(tokens.lengths.astype(np.int32), "int32"),
            vectors=wire.array_to_tensor(np.ascontiguousarray(vectors), "float32"),
            timings=self._timings(call), request_id=request.request_id)

    def _decode(self, packed: inference_pb2.PackedTokens, task: Task, field: str) -> RaggedBatch:
        """The wire's layout checks, then the model's (the engine's own, run per call here so
        one bad call cannot fail a whole batch)."""
        validate.check_task(task, self._info.task, self._info.model_id)
        tokens = wire.unpack_tokens(packed, field)
        validate.check_fits_model(tokens, self._info, field)
        return tokens

    async def _run(self, tokens: RaggedBatch, task: Task, context: Context, wire_priority: int,
                   trace: inference_pb2.TraceContext, token_states: bool = False,
                   key_lengths: np.ndarray | None = None) -> tuple[Call, np.ndarray]:
        """Admit a call in its class's queue, wait for its rows; a caller who leaves marks
        it gone. ``trace``: the caller's span, which a traced call's spans continue;
        ``token_states`` and ``key_lengths`` as ``Call`` takes them."""
        priority = wire.priority_from_proto(wire_priority)
        if not self.accepting:
            raise Unavailable("the scheduler is not serving (warming up or draining)")
        remaining = context.time_remaining()
        now = time.monotonic()
        call = Call(task, tokens, arrival=now,
                    deadline=None if remaining is None else now + remaining,
                    read_in_bulk=getattr(context, "reads_calls_in_bulk", False), priority=priority,
                    token_states=token_states, key_lengths=key_lengths)
        # Traced (docs/tracing.md): the call's span, its queue wait and the steps that served it.
        span = self._call_span(call, trace) if self._tracer is not None else None
        try:
            self._pool.admit(call)  # raises Overloaded at once when full
            try:
                rows = await call.future
            except asyncio.CancelledError:
                call.cancel(DEADLINE if _deadline_passed(context) else CANCELLED)
                self._metrics.calls_dropped.labels(call.gone_reason or CANCELLED).inc()
                raise
            except BaseException:
                self._metrics.calls_dropped.labels(call.gone_reason or "failed").inc()
                raise
        except BaseException as error:
            if span is not None:
                _end_call_span(span, call, error)
            raise
        if span is not None:
            _end_call_span(span, call, None)
        self._metrics.observe_call(priority, time.monotonic() - call.arrival)
        return call, rows

    def _call_span(self, call: Call, trace: inference_pb2.TraceContext) -> CallTrace:
        """The span of ``call``, continuing the caller's ``trace``; the batcher records the
        steps that carry its rows from now on."""
        assert self._tracer is not None
        method = TASK_METHODS[call.task]
        call.steps = []
        return self._tracer.call(method, trace.traceparent, trace.tracestate, call.arrival, {
            "rpc.system": "embedserve.frames" if call.read_in_bulk else "grpc",
            "rpc.service": "embedserve.v1.Inference", "rpc.method": method,
            "embedserve.model": self._info.model_id, "embedserve.priority": call.priority,
            "embedserve.sequences": call.tokens.num_sequences,
            "embedserve.tokens": call.tokens.num_tokens})

    @staticmethod
    def _timings(call: Call) -> inference_pb2.Timings:
        batched = call.first_batched_at if call.first_batched_at is not None else call.arrival
        return inference_pb2.Timings(queue_us=int((batched - call.arrival) * 1e6),
                                     compute_us=int(call.compute_s * 1e6),
                                     wake_us=int(call.wake_s * 1e6),
                                     total_us=int((time.monotonic() - call.arrival) * 1e6))

    async def _answer(self, method: str, context: Context, handle: Callable[[], Awaitable]):
        """Run one Embed/Score handler; map its errors to a status exactly here.

        ``max_concurrent_rpcs`` is checked here, where calls over gRPC and over frames
        meet, so it bounds their sum (each server's own limit alone let through twice it)."""
        if self.active_calls >= self._settings.max_concurrent_rpcs:
            code = grpc.StatusCode.RESOURCE_EXHAUSTED
            self._metrics.count_call(method, code.name)
            context.set_code(code)
            context.set_details("the replica is serving its maximum of concurrent calls")
            return None
        self.active_calls += 1
        self._idle.clear()
        try:
            response = await handle()
        except asyncio.CancelledError:  # the client left, or gRPC enforced the deadline
            code = grpc.StatusCode.DEADLINE_EXCEEDED if _deadline_passed(context) \
                else grpc.StatusCode.CANCELLED
            self._metrics.count_call(method, code.name)
            raise
        except Exception as error:
            code, message = grpc_status(error)
            if code is grpc.StatusCode.INTERNAL:
                log.exception("%s failed", method)
            self._metrics.count_call(method, code.name)
            context.set_code(code)
            context.set_details(message)
            # Names the class, so the gateway raises the same one (embedserve.link.status).
            context.set_trailing_metadata(error_metadata(error))
            return None
        finally:
            self.active_calls -= 1
            if self.active_calls == 0:
                self._idle.set()
        self._metrics.count_call(method, grpc.StatusCode.OK.name)
        return response


# The client enforces the same deadline and cancels the call when it passes;
# its cancel can reach us before our own timer fires (our deadline started
# when the request arrived, one network hop later). So a cancel this close to
# the deadline is counted as the deadline. Only the metrics label depends on it.
_DEADLINE_SKEW_S = 0.05


def _end_call_span(span: CallTrace, call: Call, error: BaseException | None) -> None:
    span.end(call.arrival, call.first_batched_at, call.steps or (), error,
             {"embedserve.compute_us": int(call.compute_s * 1e6)})


def _deadline_passed(context: Context) -> bool:
    """Whether the handler was cancelled because its deadline passed (best effort)."""
    remaining = context.time_remaining()
    return remaining is not None and remaining <= _DEADLINE_SKEW_S


def _row_bytes(precision: str, width: int) -> int:
    """Bytes of one ``width``-wide vector in ``precision`` (model/quantize.py's layouts)."""
    if precision in ("binary", "ubinary"):
        return -(-width // 8)
    return {"float32": 4, "float16": 2}.get(precision, 1) * width
