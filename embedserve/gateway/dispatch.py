"""Send a tokenized request to replicas as chunks and put the answers back.

Owns the fan-out: split into chunks (``chunking``), send them concurrently
through the ``ReplicaPool`` (least outstanding tokens first), retry a chunk
whose replica failed on another replica, and reassemble the rows in input
order. Knows the gRPC messages but not HTTP, nor which transport a replica
is called over (``Replica.call``). gRPC errors become embedserve errors here
(``embedserve.link.status``). Cancelling the awaiting task cancels every outstanding call.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import grpc
import numpy as np

from embedserve.errors import DeadlineExceeded, EmbedServeError
from embedserve.gateway.chunking import plan_chunks
from embedserve.gateway.replicas import REPLICA_CALL_ERRORS, Replica, ReplicaPool
from embedserve.link import wire
from embedserve.link.frame_client import FrameConnectionLost
from embedserve.link.status import REPLICA_DOWN_CODES, from_replica_error, is_retryable
from embedserve.link.wire import INTERACTIVE
from embedserve.protos import inference_pb2
from embedserve.ragged import RaggedBatch

if TYPE_CHECKING:
    from embedserve.otel import RequestTrace


@dataclass
class DispatchTimings:
    """Critical-path timings across chunks, in seconds."""

    queue_s: float = 0.0       # longest wait for a replica plus its queue time
    inference_s: float = 0.0   # longest engine compute of a chunk
    wake_s: float = 0.0        # that chunk's engine-thread -> replica-loop hop
    rpc_s: float = 0.0         # longest gRPC call as awaited here (replica time included)
    replica_s: float = 0.0     # longest replica handler time (its Timings.total_us)
    attempts: int = 0          # calls made, retries included
    retries: int = 0


@dataclass(frozen=True)
class ChunkPolicy:
    max_sequences: int
    max_tokens: int
    max_attempts: int


# Builds the request message for one chunk; the call name picks the RPC.
MakeRequest = Callable[[inference_pb2.PackedTokens], object]


async def run_chunks(pool: ReplicaPool, packed: RaggedBatch, policy: ChunkPolicy, rpc: str,
                     make_request: MakeRequest, deadline: float, request_id: str,
                     timings: DispatchTimings, on_retry: Callable[[], None] | None = None) -> np.ndarray:
    """Send ``packed`` as chunks over ``rpc`` ("Embed" or "Score"); rows in input order.

    ``deadline`` is a ``time.monotonic()`` value. The first chunk that fails
    for good cancels the others and its error is raised.
    """
    outputs = await run_chunks_outputs(pool, packed, policy, rpc, make_request, deadline,
                                       request_id, timings, on_retry)
    return outputs[0]


async def run_chunks_outputs(pool: ReplicaPool, packed: RaggedBatch, policy: ChunkPolicy, rpc: str,
                             make_request: MakeRequest, deadline: float, request_id: str,
                             timings: DispatchTimings,
                             on_retry: Callable[[], None] | None = None,
                             priority: str = INTERACTIVE,
                             trace: RequestTrace | None = None) -> list[np.ndarray]:
    """``run_chunks`` for replies carrying several arrays (Embed with ``precisions``: one
    per precision, in request order); each array's rows in input order. ``priority``:
    the class whose room on a replica the chunks take (``ReplicaPool.acquire``); the
    messages carry it themselves. ``trace``: the request's spans, when it is traced
    (each chunk's wait for a replica and each call; docs/tracing.md)."""
    max_tokens = policy.max_tokens
    info = pool.info()
    if info is not None and info.max_queue_tokens:
        max_tokens = max(1, min(max_tokens, int(info.max_queue_tokens)))
    ranges = plan_chunks(packed.lengths, policy.max_sequences, max_tokens)
    if len(ranges) == 1:
        # One chunk (most requests): awaited here, without a task group's task.
        a, b = ranges[0]
        chunk = packed if (a, b) == (0, packed.num_sequences) else packed.slice(a, b)
        return await _run_chunk(pool, chunk, policy.max_attempts, rpc, make_request, deadline,
                                request_id, timings, on_retry, priority, trace)
    try:
        async with asyncio.TaskGroup() as group:
            tasks = [group.create_task(_run_chunk(pool, packed.slice(a, b), policy.max_attempts, rpc,
                                                  make_request, deadline, request_id, timings, on_retry,
                                                  priority, trace))
                     for a, b in ranges]
    except* Exception as group_error:
        # Report the first failure as itself, not wrapped in a group.
        raise group_error.exceptions[0] from None
    parts = [t.result() for t in tasks]
    return [np.concatenate([part[k] for part in parts], axis=0) for k in range(len(parts[0]))]


# Replies whose first array has a row per sequence and whose others are ragged (flat,
# the first array's counts saying how many entries each sequence owns): chunks of such
# replies join by concatenating every array, as the others' do.
RAGGED_REPLIES = {"EmbedSparse", "EmbedTokens"}


def reply_arrays(rpc: str, reply, field: str) -> list[np.ndarray]:
    """The arrays a reply carries: scores, float vectors, the quantized vectors, a
    classifier's [B, labels] scores, a sparse reply's counts, indices and values, or a
    multi-vector reply's counts and token vectors."""
    if rpc in ("Score", "Classify"):
        return [wire.tensor_to_array(reply.scores, field=field).astype(np.float32, copy=False)]
    if rpc == "EmbedSparse":
        counts = wire.tensor_to_array(reply.counts, field=f"{field}.counts")
        indices = wire.tensor_to_array(reply.indices, field=f"{field}.indices")
        values = wire.tensor_to_array(reply.values, field=f"{field}.values")
        if counts.dtype != np.int32 or indices.dtype != np.int32 or counts.ndim != 1 \
                or indices.shape != values.shape or int(counts.sum()) != indices.shape[0]:
            raise EmbedServeError(f"{field}: counts {list(counts.shape)} do not describe "
                                  f"{indices.shape[0]} indices and {values.shape[0]} values")
        return [counts, indices, values.astype(np.float32, copy=False)]
    if rpc == "EmbedTokens":
        counts = wire.tensor_to_array(reply.counts, field=f"{field}.counts")
        vectors = wire.tensor_to_array(reply.vectors, field=f"{field}.vectors")
        if counts.dtype != np.int32 or counts.ndim != 1 or vectors.ndim != 2 \
                or int(counts.sum()) != vectors.shape[0]:
            raise EmbedServeError(f"{field}: counts {list(counts.shape)} do not describe "
                                  f"{vectors.shape[0]} token vectors")
        return [counts, vectors.astype(np.float32, copy=False)]
    if len(reply.quantized):
        return [wire.tensor_to_array(t, field=f"{field}.quantized[{k}]")
                for k, t in enumerate(reply.quantized)]
    return [wire.tensor_to_array(reply.embeddings, field=field).astype(np.float32, copy=False)]


async def _run_chunk(pool: ReplicaPool, chunk: RaggedBatch, max_attempts: int, rpc: str,
                     make_request: MakeRequest, deadline: float, request_id: str,
                     timings: DispatchTimings, on_retry: Callable[[], None] | None,
                     priority: str = INTERACTIVE, trace: RequestTrace | None = None) -> list[np.ndarray]:
    tokens = chunk.num_tokens
    message = make_request(wire.pack_tokens(chunk))
    tried: set[Replica] = set()
    last_error: EmbedServeError | None = None
    for attempt in range(max_attempts):
        waited_from = time.monotonic()
        waited_from_ns = time.time_ns() if trace is not None else 0
        replica = await pool.acquire(tokens, frozenset(tried), deadline, priority)
        gateway_wait = time.monotonic() - waited_from
        timings.attempts += 1
        span = None
        outcome = "CANCELLED"
        try:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise DeadlineExceeded("the request timed out waiting for a replica")
            if trace is not None:
                span = _dispatch_span(trace, waited_from_ns, replica, rpc, chunk, priority, attempt,
                                      message)
            called_at = time.perf_counter()
            reply = await replica.call(rpc, message, remaining, request_id)
            timings.rpc_s = max(timings.rpc_s, time.perf_counter() - called_at)
            outcome = "OK"
        except REPLICA_CALL_ERRORS as exc:
            code = exc.code()
            outcome = code.name
            last_error = from_replica_error(exc)
            # A lost frame connection says nothing of the replica's gRPC side: the
            # retry goes to another replica, or back to this one over gRPC (``acquire``
            # falls back to tried replicas), where a replica that is down shows.
            if code in REPLICA_DOWN_CODES and not isinstance(exc, FrameConnectionLost):
                await pool.mark_down(replica)
            if not is_retryable(code) or time.monotonic() >= deadline:
                raise last_error from None
            tried.add(replica)
            timings.retries += 1
            if on_retry is not None:
                on_retry()
            if code == grpc.StatusCode.RESOURCE_EXHAUSTED:
                # Give the replicas a moment to drain before asking again.
                await asyncio.sleep(min(0.05 * (attempt + 1), max(0.0, deadline - time.monotonic())))
            continue
        finally:
            await pool.release(replica, tokens, priority)
            if span is not None:
                trace.end_dispatch(span, outcome)  # type: ignore[union-attr]
        queue_s = gateway_wait + reply.timings.queue_us / 1e6
        timings.queue_s = max(timings.queue_s, queue_s)
        if reply.timings.compute_us / 1e6 >= timings.inference_s:
            timings.inference_s = reply.timings.compute_us / 1e6
            timings.wake_s = reply.timings.wake_us / 1e6
        timings.replica_s = max(timings.replica_s, reply.timings.total_us / 1e6)
        arrays = reply_arrays(rpc, reply, f"{rpc}.result")
        for rows in arrays[:1] if rpc in RAGGED_REPLIES else arrays:
            if rows.shape[0] != chunk.num_sequences:
                # Never let a wrong row count shift answers onto other inputs.
                raise EmbedServeError(f"replica {replica.address} answered {rows.shape[0]} rows "
                                      f"for {chunk.num_sequences} inputs")
        return arrays
    assert last_error is not None
    raise last_error


def _dispatch_span(trace: RequestTrace, waited_from_ns: int, replica: Replica, rpc: str,
                   chunk: RaggedBatch, priority: str, attempt: int, message):
    """Record the chunk's wait for a replica (``queue``), begin its call's ``dispatch`` span,
    and name that span in ``message`` as the parent of the replica's spans."""
    sizes: dict[str, str | int] = {"embedserve.sequences": chunk.num_sequences,
                                   "embedserve.tokens": chunk.num_tokens,
                                   "embedserve.priority": priority, "embedserve.attempt": attempt}
    trace.phase("queue", waited_from_ns, attributes=sizes)
    span = trace.dispatch({**sizes, "rpc.system": "grpc" if replica.transport == "grpc"
                           else "embedserve.frames",
                           "rpc.service": "embedserve.v1.Inference", "rpc.method": rpc,
                           "server.address": replica.address,
                           "embedserve.replica.transport": replica.transport})
    message.trace.traceparent, message.trace.tracestate = trace.context_headers(span)
    return span
