"""The ``embedserve.v1.Inference`` servicer: Embed, Score and Info over grpc.aio.

A thin layer over the pool: decode and validate a request, admit it as a
``Call``, await its rows, post-process them per call (Matryoshka dimensions,
normalization, sigmoid, output dtype) and encode the answer. Errors are
mapped to status codes in one place (``status.py``); this module only
catches them at the handler boundary. Batching and the engine live in
``batcher.py``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable

import grpc
import numpy as np

import embedserve
from embedserve import wire
from embedserve.engine.batch import Task
from embedserve.model.postprocess import postprocess_embeddings, postprocess_scores
from embedserve.errors import InputTooLong, InvalidInput, Unavailable
from embedserve.protos import inference_pb2, inference_pb2_grpc
from embedserve.scheduler.batcher import StepEngine
from embedserve.scheduler.metrics import SchedulerMetrics
from embedserve.scheduler.pool import CANCELLED, DEADLINE, Call, RequestPool
from embedserve.scheduler.settings import SchedulerSettings
from embedserve.scheduler.status import grpc_status

log = logging.getLogger(__name__)
Context = grpc.aio.ServicerContext


class InferenceService(inference_pb2_grpc.InferenceServicer):
    """Handlers for one engine. ``accepting`` is False while warming up and draining."""

    def __init__(self, engine: StepEngine, pool: RequestPool, settings: SchedulerSettings,
                 metrics: SchedulerMetrics) -> None:
        self._engine = engine
        self._info = engine.info
        self._type_vocab_size = _type_vocab_size(engine)
        self._pool = pool
        self._settings = settings
        self._metrics = metrics
        self.accepting = False
        self.active_calls = 0
        self._idle = asyncio.Event()
        self._idle.set()

    async def Embed(self, request: inference_pb2.EmbedRequest,
                    context: Context) -> inference_pb2.EmbedResponse:
        return await self._answer("Embed", context, lambda: self._embed(request, context))

    async def Score(self, request: inference_pb2.ScoreRequest,
                    context: Context) -> inference_pb2.ScoreResponse:
        return await self._answer("Score", context, lambda: self._score(request, context))

    async def Info(self, request: inference_pb2.InfoRequest,
                   context: Context) -> inference_pb2.InfoResponse:
        info, s = self._info, self._settings
        return inference_pb2.InfoResponse(
            model_id=info.model_id, dimension=info.dimension if info.task == "embed" else 0,
            max_positions=info.max_positions, max_batch_tokens=s.max_batch_tokens,
            max_batch_sequences=s.max_batch_sequences, tasks=[info.task],
            version=embedserve.__version__, device=str(info.device), dtype=str(info.dtype),
            max_queue_tokens=s.max_queue_tokens)

    async def wait_idle(self) -> None:
        """Return once no Embed/Score call is being served."""
        await self._idle.wait()

    async def _embed(self, request: inference_pb2.EmbedRequest,
                     context: Context) -> inference_pb2.EmbedResponse:
        tokens = self._decode(request.tokens, "embed", "tokens")
        dimensions = request.dimensions or None
        if dimensions is not None and not 1 <= dimensions <= self._info.dimension:
            raise InvalidInput(f"dimensions must lie in [1, {self._info.dimension}], "
                               f"got {dimensions}", field="dimensions")
        if request.dtype not in (inference_pb2.DTYPE_FLOAT32, inference_pb2.DTYPE_FLOAT16):
            raise InvalidInput(f"unknown output dtype {request.dtype}", field="dtype")
        call, rows = await self._run(tokens, "embed", context)
        vectors = postprocess_embeddings(rows, request.normalize, dimensions)
        return inference_pb2.EmbedResponse(embeddings=wire.array_to_tensor(vectors, request.dtype),
                                           timings=self._timings(call),
                                           request_id=request.request_id)

    async def _score(self, request: inference_pb2.ScoreRequest,
                     context: Context) -> inference_pb2.ScoreResponse:
        tokens = self._decode(request.pairs, "score", "pairs")
        call, rows = await self._run(tokens, "score", context)
        scores = postprocess_scores(rows.reshape(-1), request.sigmoid)
        return inference_pb2.ScoreResponse(scores=wire.array_to_tensor(scores, "float32"),
                                           timings=self._timings(call),
                                           request_id=request.request_id)

    def _decode(self, packed: inference_pb2.PackedTokens, task: Task, field: str) -> wire.Tokens:
        """Wire checks (wire.py), then model checks: task, ids in vocabulary, lengths."""
        if self._info.task != task:
            raise InvalidInput(f"this replica serves {self._info.task!r} "
                               f"({self._info.model_id}), not {task!r}")
        tokens = wire.unpack_tokens(packed, field)
        ids, vocab = tokens.token_ids, self._info.vocab_size
        if int(ids.min()) < 0 or int(ids.max()) >= vocab:
            bad = int(np.flatnonzero((ids < 0) | (ids >= vocab))[0])
            raise InvalidInput(f"{field}.token_ids[{bad}] = {int(ids[bad])} is outside the "
                               f"vocabulary [0, {vocab})", field=f"{field}.token_ids")
        too_long = np.flatnonzero(tokens.lengths > self._info.max_positions)
        if too_long.size:
            index = int(too_long[0])
            length = int(tokens.lengths[index])
            raise InputTooLong(f"sequence {index} has {length} tokens; the model takes at most "
                               f"{self._info.max_positions}", index=index, length=length,
                               limit=self._info.max_positions, field=f"{field}.lengths")
        if tokens.token_type_ids is not None:
            types = tokens.token_type_ids
            if int(types.min()) < 0 or int(types.max()) >= self._type_vocab_size:
                raise InvalidInput(f"{field}.token_type_ids must lie in "
                                   f"[0, {self._type_vocab_size})",
                                   field=f"{field}.token_type_ids")
        return tokens

    async def _run(self, tokens: wire.Tokens, task: Task,
                   context: Context) -> tuple[Call, np.ndarray]:
        """Admit a call, wait for its rows; a caller who leaves marks it gone."""
        if not self.accepting:
            raise Unavailable("the scheduler is not serving (warming up or draining)")
        remaining = context.time_remaining()
        now = time.monotonic()
        call = Call(task, tokens, arrival=now,
                    deadline=None if remaining is None else now + remaining)
        self._pool.admit(call)  # raises Overloaded at once when full
        self._metrics.queue_sequences.set(self._pool.queued_sequences)
        self._metrics.queue_tokens.set(self._pool.queued_tokens)
        try:
            rows = await call.future
        except asyncio.CancelledError:
            call.cancel(DEADLINE if _deadline_passed(context) else CANCELLED)
            self._metrics.calls_dropped.labels(call.gone_reason or CANCELLED).inc()
            raise
        except BaseException:
            self._metrics.calls_dropped.labels(call.gone_reason or "failed").inc()
            raise
        return call, rows

    @staticmethod
    def _timings(call: Call) -> inference_pb2.Timings:
        batched = call.first_batched_at if call.first_batched_at is not None else call.arrival
        return inference_pb2.Timings(queue_us=int((batched - call.arrival) * 1e6),
                                     compute_us=int(call.compute_s * 1e6),
                                     total_us=int((time.monotonic() - call.arrival) * 1e6))

    async def _answer(self, method: str, context: Context, handle: Callable[[], Awaitable]):
        """Run one Embed/Score handler; map its errors to a status exactly here."""
        self.active_calls += 1
        self._metrics.active_calls.set(self.active_calls)
        self._idle.clear()
        try:
            response = await handle()
        except asyncio.CancelledError:  # the client left, or gRPC enforced the deadline
            code = grpc.StatusCode.DEADLINE_EXCEEDED if _deadline_passed(context) \
                else grpc.StatusCode.CANCELLED
            self._metrics.calls.labels(method, code.name).inc()
            raise
        except Exception as error:
            code, message = grpc_status(error)
            if code is grpc.StatusCode.INTERNAL:
                log.exception("%s failed", method)
            self._metrics.calls.labels(method, code.name).inc()
            context.set_code(code)
            context.set_details(message)
            return None
        finally:
            self.active_calls -= 1
            self._metrics.active_calls.set(self.active_calls)
            if self.active_calls == 0:
                self._idle.set()
        self._metrics.calls.labels(method, grpc.StatusCode.OK.name).inc()
        return response


# The client enforces the same deadline and cancels the call when it passes;
# its cancel can reach us before our own timer fires (our deadline started
# when the request arrived, one network hop later). So a cancel this close to
# the deadline is counted as the deadline. Only the metrics label depends on it.
_DEADLINE_SKEW_S = 0.05


def _deadline_passed(context: Context) -> bool:
    """Whether the handler was cancelled because its deadline passed (best effort)."""
    remaining = context.time_remaining()
    return remaining is not None and remaining <= _DEADLINE_SKEW_S


def _type_vocab_size(engine: StepEngine) -> int:
    """Segment ids the model accepts (checked per call so one bad call cannot fail a batch)."""
    return max(1, int(engine.info.type_vocab_size))
