"""The public gRPC API's servicer: ``embedserve.v1.Embeddings`` (protos/embedserve/v1/embeddings.proto).

Owns translating its messages into the same calls the HTTP routes make (the
routes' own steps: ``routes.embed``'s packing, embedding and quantizing,
``routes.rerank``'s scoring and ranking, ``routes.tokenize``'s token rows,
``classify_inputs``' packing of texts and pairs with ``routes.classify``'s ranked
labels, ``sparse_outputs``' nonzeros, all over ``pipeline.Gateway``), and their answers back into messages; the API key,
admission through the HTTP side's ``Drain`` (so a shutdown drains both
transports alike), the client's deadline, metrics, and the error statuses
(``grpc_api_errors``). Serving it (ports, health, reflection) is
``grpc_server.py``'s.

A call runs with a Starlette ``Request`` of its own making (``_call_request``):
the pipeline reads a request id, a timing record and a deadline from its scope,
and watches ``receive`` for a disconnect; here nothing ever arrives on it,
since grpc.aio cancels the handler itself when the client goes away, which
cancels the replica calls the same way.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, MutableMapping, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple, TypeVar

import grpc
import numpy as np
from starlette.requests import Request

from embedserve import __version__, errors
from embedserve.gateway import embedding_types, multivector_outputs
from embedserve.gateway.classify_inputs import pack_items
from embedserve.gateway.draining import DRAINING_MESSAGE, Drain
from embedserve.gateway.grpc_api_errors import (
    UNAUTHENTICATED,
    UNEXPECTED,
    ApiStatus,
    api_status,
)
from embedserve.gateway.metrics import GatewayMetrics
from embedserve.gateway.middleware import REQUEST_ID_KEY, TIMING_KEY, TRACE_KEY, server_timing
from embedserve.gateway.pipeline import DEADLINE_KEY, Gateway, timed
from embedserve.gateway.priority import FORCED_KEY, PRIORITY_KEY
from embedserve.gateway.priority import HEADER as PRIORITY_HEADER
from embedserve.gateway.routes import embed as embed_route
from embedserve.gateway.routes import rerank as rerank_route
from embedserve.gateway.routes.classify import predictions
from embedserve.gateway.routes.tokenize import token_rows
from embedserve.gateway.routing import ModelRouter
from embedserve.gateway.sparse_outputs import check_sparse_policy, sparse_vectors
from embedserve.link.wire import BATCH
from embedserve.protos import embeddings_pb2, embeddings_pb2_grpc

if TYPE_CHECKING:
    from embedserve.otel import RequestTrace, Tracer

log = logging.getLogger(__name__)
T = TypeVar("T")

SERVICE = "embedserve.v1.Embeddings"
# Stream messages in flight at once per EmbedStream: enough to keep replicas busy
# while earlier answers are written, few enough that one stream holds bounded memory
# (and the token budget still applies to each message).
STREAM_WINDOW = 16

# InputType -> the prompt names it means, the first the model has wins; HTTP's
# input_type says "query" or "passage", models name their document prompt either way.
_PROMPTS: dict[int, tuple[str, ...]] = {
    embeddings_pb2.INPUT_TYPE_QUERY: ("query",),
    embeddings_pb2.INPUT_TYPE_DOCUMENT: ("passage", "document"),
}
_ENCODINGS = {"float": None, "float16": "<f2"}   # others are bytes as quantized


class EmbeddingsService(embeddings_pb2_grpc.EmbeddingsServicer):
    def __init__(self, router: Callable[[], ModelRouter | None], drain: Drain,
                 metrics: GatewayMetrics, api_key: str | None, max_inputs: int,
                 max_message_bytes: int, tracer: Tracer | None = None,
                 batch_api_keys: tuple[str, ...] = ()) -> None:
        """``router``: the app's models, None until its lifespan has started them;
        ``tracer``: the app's (docs/tracing.md), None when tracing is off;
        ``batch_api_keys``: keys accepted as ``api_key`` is, whose calls run in the batch
        class whatever they ask (docs/priority.md), as on HTTP."""
        self._router = router
        self._drain = drain
        self._metrics = metrics
        self._api_key = None if api_key is None else f"Bearer {api_key}".encode()
        self._batch_keys = tuple(f"Bearer {key}".encode() for key in batch_api_keys)
        self._max_inputs = max_inputs
        self._max_message_bytes = max_message_bytes
        self._tracer = tracer

    # -- the methods ---------------------------------------------------------

    async def Embed(self, request: embeddings_pb2.EmbedTextsRequest,
                    context: grpc.aio.ServicerContext) -> embeddings_pb2.EmbedTextsResponse:
        return await self._unary("Embed", context, lambda call: self._embed(request, call, "Embed"))

    async def EmbedStream(self, requests: AsyncIterator[embeddings_pb2.EmbedTextsRequest],
                          context: grpc.aio.ServicerContext
                          ) -> AsyncIterator[embeddings_pb2.EmbedStreamResponse]:
        priority = _CallPriority.of(context, self._forced_batch(context))
        if not self._authorized(context, priority):
            await self._abort(context, UNAUTHENTICATED, "EmbedStream", time.perf_counter())
        # Each message is started as it arrives (about STREAM_WINDOW ahead of the answer
        # being written) and answered in arrival order; the reader stops taking messages
        # while the window is full, so gRPC's flow control holds the client back.
        window: asyncio.Queue[asyncio.Future | None] = asyncio.Queue(STREAM_WINDOW)
        stream_id = _request_id(context)

        async def read() -> None:
            index = 0
            try:
                async for message in requests:
                    await window.put(asyncio.ensure_future(
                        self._stream_message(index, message, context, f"{stream_id}-{index}", priority)))
                    index += 1
            except Exception:
                # The request stream broke: the messages started are answered, then the
                # call fails. (Not on cancellation: nobody would take the end mark.)
                await window.put(None)
                raise
            await window.put(None)

        reader = asyncio.ensure_future(read())
        try:
            while (answer := await window.get()) is not None:
                yield await answer
            await reader   # a broken request stream fails the call here
        finally:
            reader.cancel()
            while not window.empty():
                pending = window.get_nowait()
                if pending is not None:
                    pending.cancel()

    async def Rerank(self, request: embeddings_pb2.RerankRequest,
                     context: grpc.aio.ServicerContext) -> embeddings_pb2.RerankResponse:
        return await self._unary("Rerank", context, lambda call: self._rerank(request, call))

    async def EmbedTokens(self, request: embeddings_pb2.EmbedTokensTextRequest,
                          context: grpc.aio.ServicerContext) -> embeddings_pb2.EmbedTokensTextResponse:
        return await self._unary("EmbedTokens", context, lambda call: self._embed_tokens(request, call))

    async def Tokenize(self, request: embeddings_pb2.TokenizeRequest,
                       context: grpc.aio.ServicerContext) -> embeddings_pb2.TokenizeResponse:
        return await self._unary("Tokenize", context, lambda call: self._tokenize(request, call))

    async def Info(self, request: embeddings_pb2.ServiceInfoRequest,
                   context: grpc.aio.ServicerContext) -> embeddings_pb2.ServiceInfoResponse:
        return await self._unary("Info", context, lambda call: self._info())

    async def Classify(self, request: embeddings_pb2.ClassifyTextsRequest,
                       context: grpc.aio.ServicerContext) -> embeddings_pb2.ClassifyTextsResponse:
        return await self._unary("Classify", context, lambda call: self._classify(request, call))

    async def EmbedSparse(self, request: embeddings_pb2.EmbedSparseTextsRequest,
                          context: grpc.aio.ServicerContext) -> embeddings_pb2.EmbedSparseTextsResponse:
        return await self._unary("EmbedSparse", context, lambda call: self._embed_sparse(request, call))

    # -- what each does ------------------------------------------------------

    async def _embed(self, message: embeddings_pb2.EmbedTextsRequest, call: Request,
                     method: str) -> embeddings_pb2.EmbedTextsResponse:
        route = _route(method)
        gateway, model = self._models().route(message.model or None, "embed")
        dimensions = gateway.check_dimensions(
            message.dimensions if message.HasField("dimensions") else None)
        policy = gateway.preprocessor.long_input_policy(
            message.truncate or None, None,
            message.chunk_overlap if message.HasField("chunk_overlap") else None)
        types = embedding_types.check_embedding_types(list(message.embedding_types)) \
            if message.embedding_types else ["float"]
        normalize = message.normalize if message.HasField("normalize") else gateway.model.normalize
        prompt_name = _prompt_name(gateway, message.input_type)
        packed = await embed_route._pack(gateway, call, list(message.inputs), "inputs", prompt_name,
                                         policy)
        if message.embedding_types:
            arrays, tokens = await embed_route.embed_types(gateway, call, packed, policy, types,
                                                           normalize, dimensions, route)
        else:   # plain float vectors: HTTP's path without embedding_types
            vectors, tokens = await embed_route._embed(gateway, call, packed, policy, normalize,
                                                       dimensions, route)
            arrays = [vectors]
        return embeddings_pb2.EmbedTextsResponse(
            embeddings=_embeddings(types, arrays), model=model,
            usage=embeddings_pb2.Usage(prompt_tokens=tokens, total_tokens=tokens))

    async def _rerank(self, message: embeddings_pb2.RerankRequest,
                      call: Request) -> embeddings_pb2.RerankResponse:
        gateway, model = self._models().route(message.model or None, "score")
        if message.HasField("top_n") and message.top_n < 1:
            raise errors.InvalidInput(f"top_n must be at least 1, got {message.top_n}", field="top_n")
        documents = list(message.documents)
        scores, tokens = await rerank_route._scores(
            gateway, call, message.query, documents, "documents", message.truncate, "right",
            not message.raw_scores, _route("Rerank"))
        order = rerank_route._ranked(scores)
        if message.HasField("top_n"):
            order = order[:message.top_n]
        return embeddings_pb2.RerankResponse(
            results=[embeddings_pb2.RankedDocument(
                index=i, score=float(scores[i]),
                document=documents[i] if message.return_documents else "") for i in order],
            model=model, usage=embeddings_pb2.Usage(prompt_tokens=tokens, total_tokens=tokens))

    async def _embed_tokens(self, message: embeddings_pb2.EmbedTokensTextRequest,
                            call: Request) -> embeddings_pb2.EmbedTokensTextResponse:
        gateway, model = self._models().route(message.model or None, "tokens")
        inputs = list(message.inputs)
        if not inputs:
            raise errors.InvalidInput("inputs must not be empty", field="inputs")
        gateway.check_count(len(inputs), "inputs")
        policy = gateway.preprocessor.long_input_policy(message.truncate or None, None, None)
        multivector_outputs.check_multivector_policy(policy)
        input_type = {embeddings_pb2.INPUT_TYPE_QUERY: "query",
                      embeddings_pb2.INPUT_TYPE_DOCUMENT: "document"}.get(message.input_type)
        rows, packed = await multivector_outputs.token_vectors(
            gateway, call, inputs, input_type, None, policy, "inputs", _route("EmbedTokens"))
        tokens = packed.num_tokens
        return embeddings_pb2.EmbedTokensTextResponse(
            inputs=[embeddings_pb2.TokenVectors(rows=row.shape[0], values=row.reshape(-1).tolist())
                    for row in rows],
            # an embedder's token states are hidden-size wide, whatever its pooled dimension
            dimension=rows[0].shape[1] if rows else gateway.model.dimension, model=model,
            usage=embeddings_pb2.Usage(prompt_tokens=tokens, total_tokens=tokens))

    async def _tokenize(self, message: embeddings_pb2.TokenizeRequest,
                        call: Request) -> embeddings_pb2.TokenizeResponse:
        gateway, _ = self._models().route(message.model or None, None)
        add_special = message.add_special_tokens if message.HasField("add_special_tokens") else True
        rows = await token_rows(gateway, call, list(message.inputs), message.prompt_name or None,
                                add_special)
        return embeddings_pb2.TokenizeResponse(inputs=[
            embeddings_pb2.TokenizedInput(tokens=[embeddings_pb2.Token(**token) for token in row])
            for row in rows])

    async def _info(self) -> embeddings_pb2.ServiceInfoResponse:
        models = [embeddings_pb2.ServedModelInfo(
            name=g.model_id, aliases=g.served_names[1:], task=g.task, dimension=g.model.dimension,
            max_input_tokens=g.model.max_positions, normalize=g.model.normalize,
            prompts=sorted(g.model.prompts)) for g in self._models().gateways]
        return embeddings_pb2.ServiceInfoResponse(
            models=models, version=__version__,
            embedding_types=list(embedding_types.EMBEDDING_TYPES),
            max_inputs=self._max_inputs, max_message_bytes=self._max_message_bytes)

    async def _classify(self, message: embeddings_pb2.ClassifyTextsRequest,
                        call: Request) -> embeddings_pb2.ClassifyTextsResponse:
        """HTTP /predict's work: singles or pairs, probabilities unless raw_scores."""
        gateway, model = self._models().route(message.model or None, "classify")
        inputs, pairs = list(message.inputs), list(message.text_pairs)
        if not inputs:
            raise errors.InvalidInput("inputs must not be empty", field="inputs")
        if pairs and len(pairs) != len(inputs):
            raise errors.InvalidInput(f"text_pairs has {len(pairs)} texts for {len(inputs)} inputs; "
                                      "send one per input, or none", field="text_pairs")
        gateway.check_count(len(inputs), "inputs")
        items = list(zip(inputs, pairs, strict=True)) if pairs else [(text, None) for text in inputs]
        packed = await timed(call, "tokenize", pack_items(gateway.preprocessor, items, message.truncate,
                                                          "right", "inputs"))
        scores = await gateway.classify(call, packed, message.raw_scores, _route("Classify"))
        labels = gateway.model.labels
        tokens = packed.num_tokens
        return embeddings_pb2.ClassifyTextsResponse(
            results=[embeddings_pb2.Classification(scores=[embeddings_pb2.LabelScore(**p)
                                                            for p in predictions(row, labels)])
                     for row in scores],
            model=model, usage=embeddings_pb2.Usage(prompt_tokens=tokens, total_tokens=tokens))

    async def _embed_sparse(self, message: embeddings_pb2.EmbedSparseTextsRequest,
                            call: Request) -> embeddings_pb2.EmbedSparseTextsResponse:
        """HTTP /embed_sparse's work: each input's nonzeros, top_k of them when asked."""
        gateway, model = self._models().route(message.model or None, "sparse")
        top_k = message.top_k if message.HasField("top_k") else None
        if top_k is not None and top_k < 1:
            raise errors.InvalidInput(f"top_k must be at least 1, got {top_k}", field="top_k")
        policy = gateway.preprocessor.long_input_policy(message.truncate or None, None, None)
        check_sparse_policy(policy)
        prompt_name = _prompt_name(gateway, message.input_type)
        packed = await embed_route._pack(gateway, call, list(message.inputs), "inputs", prompt_name, policy)
        rows = await sparse_vectors(gateway, call, packed, top_k, _route("EmbedSparse"))
        tokens = packed.num_tokens
        return embeddings_pb2.EmbedSparseTextsResponse(
            embeddings=[embeddings_pb2.SparseEmbedding(indices=ids.tolist(), values=values.tolist())
                        for ids, values in rows],
            model=model, usage=embeddings_pb2.Usage(prompt_tokens=tokens, total_tokens=tokens))

    # -- what every call shares ----------------------------------------------

    def _models(self) -> ModelRouter:
        router = self._router()
        if router is None:
            raise errors.Unavailable("the gateway is starting; retry shortly")
        return router

    def _authorized(self, context: grpc.aio.ServicerContext, priority: _CallPriority) -> bool:
        # Constant time, as the HTTP side compares its keys. With batch keys alone (no
        # --api-key), calls without one are still accepted, as on HTTP.
        return (priority.forced_batch or self._api_key is None
                or hmac.compare_digest(_authorization(context), self._api_key))

    def _forced_batch(self, context: grpc.aio.ServicerContext) -> bool:
        """Whether the call bears one of the batch API keys (each compared in constant time)."""
        if not self._batch_keys:
            return False
        given = _authorization(context)
        return any([hmac.compare_digest(given, key) for key in self._batch_keys])

    async def _unary(self, method: str, context: grpc.aio.ServicerContext,
                     work: Callable[[Request], Awaitable[T]]) -> T:
        """Run one unary call's ``work`` admitted, under its deadline, counted; abort on error."""
        started = time.perf_counter()
        priority = _CallPriority.of(context, self._forced_batch(context))
        if not self._authorized(context, priority):
            await self._abort(context, UNAUTHENTICATED, method, started)
        trace = self._request_trace(method, context)
        code = grpc.StatusCode.UNKNOWN
        scope: MutableMapping[str, Any] = {}   # the call's, once made: the finally reads its class
        try:
            try:
                call = _call_request(method, _request_id(context), context.time_remaining(), trace, priority)
                scope = call.scope
                with self._admitted():
                    answer = await work(call)
            except errors.EmbedServeError as exc:
                status = api_status(exc)
                code = status.code
                await self._abort(context, status, method, started)
            except asyncio.CancelledError:   # the client left or its deadline passed
                code = grpc.StatusCode.CANCELLED
                self._metrics.count_request(_route(method), code.name, time.perf_counter() - started)
                raise
            except Exception:
                log.exception("unhandled error in %s", _route(method))
                await self._abort(context, UNEXPECTED, method, started)
            code = grpc.StatusCode.OK
            context.set_trailing_metadata((("x-request-id", call.scope[REQUEST_ID_KEY]),
                                           ("server-timing", server_timing(call.scope[TIMING_KEY]))))
            self._metrics.count_request(_route(method), code.name, time.perf_counter() - started)
            return answer
        finally:
            if PRIORITY_KEY in scope:   # a call that reached a model route's pipeline
                self._metrics.count_class_request(scope[PRIORITY_KEY], time.perf_counter() - started)
            if trace is not None:
                trace.end_rpc(code.name)

    def _request_trace(self, method: str, context: grpc.aio.ServicerContext) -> RequestTrace | None:
        """The call's SERVER span, continuing the client's ``traceparent`` metadata, as HTTP
        requests continue the header; None when tracing is off (docs/tracing.md)."""
        if self._tracer is None:
            return None
        metadata = {key: value for key, value in context.invocation_metadata() or ()
                    if key in ("traceparent", "tracestate") and isinstance(value, str)}
        return self._tracer.request("", f"{SERVICE}/{method}", metadata.get("traceparent"),
                                    metadata.get("tracestate"),
                                    {"rpc.system": "grpc", "rpc.service": SERVICE, "rpc.method": method},
                                    name=f"{SERVICE}/{method}")

    async def _stream_message(self, index: int, message: embeddings_pb2.EmbedTextsRequest,
                              context: grpc.aio.ServicerContext, request_id: str,
                              priority: _CallPriority) -> embeddings_pb2.EmbedStreamResponse:
        """One stream message's answer: its embeddings, or its error (the stream goes on)."""
        started = time.perf_counter()
        status: ApiStatus | None = None
        try:
            call = _call_request("EmbedStream", request_id, context.time_remaining(), priority=priority)
            with self._admitted():
                answer = await self._embed(message, call, "EmbedStream")
        except errors.EmbedServeError as exc:
            status = api_status(exc)
        except Exception:
            log.exception("unhandled error in %s", _route("EmbedStream"))
            status = UNEXPECTED
        code = grpc.StatusCode.OK if status is None else status.code
        self._metrics.count_request(_route("EmbedStream"), code.name, time.perf_counter() - started)
        if status is None:
            return embeddings_pb2.EmbedStreamResponse(index=index, response=answer)
        return embeddings_pb2.EmbedStreamResponse(index=index, error=embeddings_pb2.StreamError(
            code=status.code.value[0], message=status.message, field=status.field or "",
            reason=status.reason, retry_after_s=status.retry_after_s or 0.0))

    def _admitted(self):
        """The drain's admission, as HTTP requests are admitted (refused once draining)."""
        if self._drain.draining:
            raise errors.Unavailable(DRAINING_MESSAGE)
        return self._drain.admitted_request()

    async def _abort(self, context: grpc.aio.ServicerContext, status: ApiStatus, method: str,
                     started: float) -> None:
        self._metrics.count_request(_route(method), status.code.name, time.perf_counter() - started)
        await context.abort(status.code, status.message, status.trailing_metadata())


def _route(method: str) -> str:
    """The metrics' route label of a method: its gRPC path, e.g. /embedserve.v1.Embeddings/Embed."""
    return f"/{SERVICE}/{method}"


def _request_id(context: grpc.aio.ServicerContext) -> str:
    """The client's ``x-request-id`` when it is short and printable (it goes into logs), else new."""
    given = next((value for key, value in context.invocation_metadata() or ()
                  if key == "x-request-id"), "")
    if isinstance(given, str) and 0 < len(given) <= 128 and all(33 <= ord(c) < 127 for c in given):
        return given
    return uuid.uuid4().hex


class _CallPriority(NamedTuple):
    """What a call says about its priority class: its ``x-embedserve-priority`` metadata,
    and whether it bears a batch API key (which forces the batch class)."""

    asked: str | None
    forced_batch: bool

    @classmethod
    def of(cls, context: grpc.aio.ServicerContext, forced_batch: bool) -> _CallPriority:
        asked = next((value for key, value in context.invocation_metadata() or ()
                      if key == PRIORITY_HEADER), None)
        return cls(asked if isinstance(asked, str) else None, forced_batch)


def _authorization(context: grpc.aio.ServicerContext) -> bytes:
    given = next((value for key, value in context.invocation_metadata() or ()
                  if key == "authorization"), "")
    return given.encode() if isinstance(given, str) else bytes(given)


def _call_request(method: str, request_id: str, time_remaining: float | None,
                  trace: RequestTrace | None = None, priority: _CallPriority | None = None) -> Request:
    """The Request the pipeline reads: request id, timings, the client's deadline, the
    priority class's inputs as an HTTP request carries them (the header, a batch key's
    forced class: gateway/priority.py reads them alike) and, when traced, the call's span
    (the pipeline's phases and dispatches go under it)."""
    if time_remaining is not None and time_remaining <= 0:
        raise errors.DeadlineExceeded("the call's deadline passed before it was served")
    headers = [] if priority is None or priority.asked is None else \
        [(PRIORITY_HEADER.encode(), priority.asked.encode("latin-1", "replace"))]
    scope: dict[str, Any] = {"type": "http", "method": "POST", "path": _route(method), "headers": headers,
                             REQUEST_ID_KEY: request_id, TIMING_KEY: {}}
    if priority is not None and priority.forced_batch:
        scope[FORCED_KEY] = BATCH
    if trace is not None:
        scope[TRACE_KEY] = trace
    if time_remaining is not None:
        scope[DEADLINE_KEY] = time.monotonic() + time_remaining
    return Request(scope, _never_disconnects)


async def _never_disconnects() -> dict:
    """A gRPC client's leaving cancels the handler itself; nothing arrives here."""
    await asyncio.get_running_loop().create_future()
    raise AssertionError("unreachable")


def _prompt_name(gateway: Gateway, input_type: int) -> str | None:
    """The model's prompt name for ``input_type``; InvalidInput naming input_type when it has none."""
    if input_type == embeddings_pb2.INPUT_TYPE_UNSPECIFIED:
        return None
    names = _PROMPTS.get(input_type)
    if names is None:
        raise errors.InvalidInput(f"input_type: unknown value {input_type}", field="input_type")
    prompts = gateway.model.prompts
    for name in names:
        if name in prompts:
            return name
    known = ", ".join(sorted(prompts)) or "none"
    raise errors.InvalidInput(f"input_type: the model `{gateway.model_id}` has no {names[0]!r} "
                              f"prompt (its prompts: {known})", field="input_type")


def _embeddings(types: Sequence[str], arrays: Sequence[np.ndarray]) -> list[embeddings_pb2.Embedding]:
    """Row i of each type's array [B, w] -> Embedding i's field of that type's name."""
    rows = len(arrays[0])
    fields: list[dict] = [{} for _ in range(rows)]
    for name, array in zip(types, arrays):
        encoding = _ENCODINGS.get(name, "")
        if encoding is None:   # float: a packed repeated float
            values = np.asarray(array, dtype=np.float32).tolist()
        else:
            dtype = array.dtype.newbyteorder("<") if encoding == "" else np.dtype(encoding)
            values = [row.tobytes() for row in np.ascontiguousarray(array, dtype=dtype)]
        for i in range(rows):
            fields[i][name] = values[i]
    return [embeddings_pb2.Embedding(**f) for f in fields]
