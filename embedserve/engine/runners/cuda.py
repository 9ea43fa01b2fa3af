"""The CUDA execution path: one engine thread owns the stream; graphs are captured lazily.

Owns running steps on a GPU without blocking the caller or the event loop:

- ``submit`` only queues the step and returns a LazyTensor at once. One engine
  thread does all device work in submission order: it pads the batch into a
  pinned staging buffer, copies it to the device, runs the forward eagerly,
  captures it, or replays a graph as the GraphCache decides, copies the
  result back into a pinned buffer and records an event. While the GPU runs a
  step, the engine thread already stages the next one.
- One completion thread waits on those events (blocking events: the thread
  sleeps instead of spinning) in order, copies each result out and resolves
  its future, so ``wait(timeout)`` and ``await`` work like the CPU path's.
- Capture runs on the engine thread in thread-local error mode, so the
  completion thread's event waits during a capture are legal.
- Staging buffers (input and output) are pinned once per bucket, two per
  bucket: a step reuses a buffer once the step that used it before is done.
- A CUDA error that survives a device synchronize (a sticky error: the
  context is poisoned) turns this and every later step into ``DeviceLost``
  (``device_lost`` in stats); the scheduler then stops serving and exits so that its
  supervisor restarts it.

Attention is the varlen kernel (modules/varlen_attention.py) where it covers
the model's dtype, else the static masked layouts (graphs/buckets.py); with
graphs off, steps run at their exact shapes, unpadded.

Only CudaGraphBackend touches torch.cuda graphs; it is the CaptureBackend that
graphs/cache.py's policy drives, and that policy is tested on CPU with a fake
backend. tests/gpu/ checks this module on a GPU.
"""

from __future__ import annotations

import concurrent.futures
import logging
import threading
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from embedserve.engine.batch import Batch, check_batch
from embedserve.engine.graphs.buckets import bucket_forward, bucket_inputs, input_size
from embedserve.engine.graphs.cache import GraphCache
from embedserve.engine.graphs.shapes import BucketKey, bucket_for, reachable_buckets
from embedserve.engine.lazy import FutureLazyTensor, LazyTensor
from embedserve.engine.modules import varlen_attention
from embedserve.engine.modules.attention import AttentionKind
from embedserve.engine.modules.forward import Model
from embedserve.errors import DeviceLost, InvalidInput
from embedserve.model.cuda_options import ATTENTION_CHOICES, CudaOptions
from embedserve.model.info import ModelInfo
from embedserve.model.modernbert_config import LOCAL

log = logging.getLogger(__name__)


@dataclass
class StepInputs:
    """What a backend runs: the shape (a bucket, or a step's exact shape when
    graphs are off) and the pinned host array of ``input_size(key)`` int64."""

    key: BucketKey
    host: torch.Tensor


@dataclass
class Captured:
    graph: Any
    static_input: torch.Tensor
    static_output: torch.Tensor
    nbytes: int


class CudaGraphBackend:
    """Eager runs, graph capture and replay of ``bucket_forward`` on one stream.

    Each captured bucket owns a static input buffer (the graph reads from its
    fixed address), the output tensor the graph writes and a private memory pool.
    A shared pool would use less memory, but what one graph frees could not be
    returned while the others live, so ``--graph-memory`` would bound a count, not
    the device memory reserved: here a graph's size is what the device reserved
    for its capture, and releasing it gives that back (``torch.cuda.memory_reserved``
    falls by it).
    """

    def __init__(self, model: Model, pooling: str, stream: Any, varlen: bool) -> None:
        self._model = model
        self._pooling = pooling
        self._stream = stream
        self._varlen = varlen
        self._device = next(model.parameters()).device

    def run_eager(self, key: BucketKey, inputs: StepInputs) -> torch.Tensor:
        flat = inputs.host.to(self._device, non_blocking=True)
        return bucket_forward(self._model, flat, inputs.key, self._pooling, self._varlen)

    def capture(self, key: BucketKey, inputs: StepInputs) -> Captured:
        # Only this stream's work must be done before capturing (not the device's).
        self._stream.synchronize()
        before = torch.cuda.memory_reserved(self._device)
        static_input = torch.empty(input_size(key), dtype=torch.int64, device=self._device)
        static_input.copy_(inputs.host, non_blocking=True)
        graph = torch.cuda.CUDAGraph()
        # Thread-local: other threads (the completion thread's event waits) may
        # keep calling CUDA while this thread captures.
        graph.capture_begin(pool=torch.cuda.graph_pool_handle(), capture_error_mode="thread_local")
        try:
            static_output = bucket_forward(self._model, static_input, key, self._pooling, self._varlen)
        finally:
            graph.capture_end()
        nbytes = torch.cuda.memory_reserved(self._device) - before
        return Captured(graph, static_input, static_output, nbytes)

    def replay(self, key: BucketKey, captured: Captured, inputs: StepInputs) -> torch.Tensor:
        captured.static_input.copy_(inputs.host, non_blocking=True)
        captured.graph.replay()
        return captured.static_output

    def release(self, key: BucketKey, captured: Captured) -> None:
        # Replays are ordered on this stream: none may still read the pool.
        self._stream.synchronize()
        captured.graph.reset()
        del captured.static_input, captured.static_output
        torch.cuda.empty_cache()          # the freed private pool goes back to the device

    def nbytes(self, captured: Captured) -> int:
        return captured.nbytes


class StagingSlot:
    """A pinned input and output buffer pair, and the event of the step using them."""

    def __init__(self, key: BucketKey) -> None:
        self.host = torch.empty(input_size(key), dtype=torch.int64, pin_memory=True)
        self.output: torch.Tensor | None = None
        self.event = torch.cuda.Event(blocking=True)
        self.free = threading.Event()
        self.free.set()

    def output_for(self, shape: tuple[int, ...]) -> torch.Tensor:
        if self.output is None or tuple(self.output.shape) != shape:
            self.output = torch.empty(shape, dtype=torch.float32, pin_memory=True)
        return self.output


class Staging:
    """Two slots per bucket, used in turn (double buffering)."""

    SLOTS = 2

    def __init__(self) -> None:
        self._slots: dict[BucketKey, list[StagingSlot]] = {}
        self._turn: dict[BucketKey, int] = {}

    def take(self, key: BucketKey) -> StagingSlot:
        """The bucket's next slot, once the step that used it last is done with it."""
        slots = self._slots.get(key)
        if slots is None:
            slots = self._slots[key] = [StagingSlot(key) for _ in range(self.SLOTS)]
            self._turn[key] = 0
        slot = slots[self._turn[key]]
        self._turn[key] = (self._turn[key] + 1) % self.SLOTS
        slot.free.wait()
        slot.free.clear()
        return slot


def resolve_attention(attention: str, model: Model) -> bool:
    """True for the varlen kernel. "auto": varlen where it covers the model's dtype and
    runs its head size (one tiny call at load), else the padded layouts."""
    if attention not in ATTENTION_CHOICES:
        raise ValueError(f"CUDA attention must be one of {ATTENTION_CHOICES}, got {attention!r}")
    if attention == "padded":
        return False
    parameter = next(model.parameters())
    failure = _varlen_failure(model, parameter.dtype, parameter.device)
    if failure is None:
        return True
    if attention == "varlen":
        raise ValueError(f"--cuda-attention varlen: {failure}")
    log.info("CUDA attention: padded layouts (%s)", failure)
    return False


def attention_kinds(model: Model) -> set[AttentionKind]:
    """Every attention kind ``model`` asks the layout for: its own, and a windowed
    layer's window where it has some (ModernBERT's local layers)."""
    kinds = {model.attention_kind}
    config = model.config
    if LOCAL in getattr(config, "layer_types", ()):
        kinds.add(AttentionKind(window=config.local_window // 2))  # type: ignore[union-attr]  # ModernBERT's
    return kinds


def _varlen_failure(model: Model, dtype: torch.dtype, device: torch.device,
                    kernel: varlen_attention.VarlenKernel | None = None) -> str | None:
    """Why the varlen kernel cannot run this model here, or None when it can: one tiny
    call per attention kind the model uses, with its head counts. Any exception counts
    (a PyTorch whose kernel lacks a keyword raises TypeError or ValueError, not
    RuntimeError), so such a model is served on the padded layouts, never failed."""
    if not varlen_attention.covers(dtype, device) and kernel is None:
        return f"the varlen kernel does not cover {dtype} on {device.type} in this PyTorch"
    config = model.config
    heads, head_dim = config.num_heads, config.head_dim
    kv_heads = getattr(config, "num_kv_heads", heads)
    q = torch.zeros(2, heads, head_dim, dtype=dtype, device=device)
    kv = torch.zeros(2, kv_heads, head_dim, dtype=dtype, device=device)
    attend = varlen_attention.varlen_from_lengths(torch.tensor([2], device=device), 2, kernel=kernel)
    if kv_heads != heads and not attend.grouped_heads:
        kv = kv.repeat_interleave(heads // kv_heads, dim=1)
    for kind in sorted(attention_kinds(model), key=repr):
        try:
            attend(q, kv, kv, kind)
            if device.type == "cuda":
                torch.cuda.synchronize(device)
        except Exception as error:
            return f"the varlen kernel refused {kind} at head size {head_dim}: {error}"
    return None


class CudaRunner:
    """Steps on one CUDA device, as ``options`` say (model/cuda_options.py);
    ``use_graphs`` False runs every step eagerly at its exact shape."""

    def __init__(self, model: Model, info: ModelInfo, options: CudaOptions = CudaOptions(),
                 use_graphs: bool = True) -> None:
        self._model = model
        self._info = info
        self._device = next(model.parameters()).device
        self._stream = torch.cuda.Stream(device=self._device)
        self.varlen = resolve_attention(options.attention, model)
        self._use_graphs = use_graphs
        self._buckets = reachable_buckets(options.graph_tokens, options.graph_sequences)
        backend = CudaGraphBackend(model, info.pooling, self._stream, self.varlen)
        # A zero graphable range turns graphs off: every step runs eagerly.
        self._cache = GraphCache(backend, max_graphs=options.max_graphs or len(self._buckets),
                                 max_tokens=options.graph_tokens if use_graphs else 0,
                                 max_sequences=options.graph_sequences,
                                 max_bytes=options.graph_memory_bytes)
        self._staging = Staging()
        self._engine_thread = concurrent.futures.ThreadPoolExecutor(1, "embedserve-cuda")
        self._completion_thread = concurrent.futures.ThreadPoolExecutor(1, "embedserve-cuda-done")
        self._lost: str | None = None
        self._counts_lock = threading.Lock()
        self._counts = {"steps": 0, "failed_steps": 0, "tokens": 0}
        if options.capture_at_start and use_graphs:
            self.capture_all()

    # Steps are not preempted between layers (docs/priority.md): a step is a graph
    # replay or a stream of kernels already issued, and a GPU step is short.
    preempts_steps = False

    def submit(self, batch: Batch, inline: bool = False, preempt: bool = False) -> LazyTensor:
        """Issue ``batch`` on the engine thread. ``inline`` is ignored: a CUDA step is
        asynchronous on its stream, so the caller's thread has nothing to compute;
        ``preempt`` too: steps run in submission order (``preempts_steps``)."""
        self._count("steps")
        future: concurrent.futures.Future[np.ndarray] = concurrent.futures.Future()
        try:
            check_batch(batch, self._info)
            if batch.key_lengths is not None:
                raise InvalidInput("key-limited attention (ColBERT query expansion) runs on the CPU only")
            if batch.token_states:
                raise InvalidInput("token states (/embed_all for an embedding model) are computed on the "
                                   "CPU only so far; serve the model with --device cpu for them")
            if self._lost is not None:
                raise DeviceLost(self._lost)
            self._engine_thread.submit(self._issue, batch, future)
        except Exception as exc:
            self._fail(future, exc)
        return FutureLazyTensor(future)

    def capture_all(self) -> None:
        """Warm and capture every reachable bucket now (``--capture-at-start``), smallest
        first, until the cache is full; blocks until done."""
        for key in self._buckets:
            if len(self._cache.cached_keys) >= self._cache.max_graphs:
                break
            batch = self._filler(key)
            if batch is not None:
                for _ in range(2):                               # warm-up, then capture
                    self.submit(batch).wait()

    def _filler(self, key: BucketKey) -> Batch | None:
        """A batch of token 0s that maps to ``key``, or None where no step can
        (sequences of at most max_positions tokens cannot fill its tokens)."""
        tokens = min(key.tokens, key.sequences * self._info.max_positions)
        if bucket_for(tokens, key.sequences) != key:
            return None
        lengths = np.full(key.sequences, tokens // key.sequences, dtype=np.int32)
        lengths[:tokens % key.sequences] += 1
        return Batch.from_lengths(np.zeros(tokens, dtype=np.int32), lengths, self._info.task)  # type: ignore[arg-type]  # a Task: checked at load

    def _issue(self, batch: Batch, future: concurrent.futures.Future) -> None:
        """Engine thread: stage, run, copy back, record; the completion thread takes over."""
        slot: StagingSlot | None = None
        try:
            if self._lost is not None:
                raise DeviceLost(self._lost)
            bucket = bucket_for(batch.num_tokens, batch.num_sequences)
            key = bucket if self._use_graphs else BucketKey(batch.num_tokens, batch.num_sequences)
            slot = self._staging.take(bucket)
            host = slot.host[:input_size(key)]
            host.numpy()[:] = bucket_inputs(batch, key, self._model.config.position_offset)
            with torch.cuda.stream(self._stream), torch.inference_mode():
                out = self._cache.run(batch.num_tokens, batch.num_sequences, StepInputs(key, host))
                # Sized for the bucket's rows, so exact-shape eager steps reuse it too.
                result = slot.output_for((bucket.sequences + 1, *out.shape[1:]))[:batch.num_sequences]
                result.copy_(out[:batch.num_sequences], non_blocking=True)
                slot.event.record(self._stream)
        except Exception as exc:
            if slot is not None:
                slot.free.set()
            self._fail(future, self._classify(exc))
            return
        self._count("tokens", batch.num_tokens)
        self._completion_thread.submit(self._complete, slot, result, future)

    def _complete(self, slot: StagingSlot, result: torch.Tensor,
                  future: concurrent.futures.Future) -> None:
        """Completion thread: wait for the step's event, copy the rows out, resolve."""
        try:
            slot.event.synchronize()
            value = result.numpy().copy()      # the slot is reused by a later step
        except Exception as exc:
            self._fail(future, self._classify(exc))
            return
        finally:
            slot.free.set()
        future.set_result(value)

    def _classify(self, exc: Exception) -> Exception:
        """``exc``, or DeviceLost where the error is sticky (the context is poisoned)."""
        if isinstance(exc, DeviceLost) or not isinstance(exc, RuntimeError):
            return exc
        try:
            torch.cuda.synchronize(self._device)
        except Exception as sticky:
            if self._lost is None:
                self._lost = f"the CUDA context is unusable: {sticky}"
                log.critical("%s; this replica must be restarted", self._lost)
            return DeviceLost(self._lost)
        return exc

    def _fail(self, future: concurrent.futures.Future, exc: Exception) -> None:
        self._count("failed_steps")
        future.set_exception(exc)

    def _count(self, name: str, amount: int = 1) -> None:
        with self._counts_lock:
            self._counts[name] += amount

    def stats(self) -> dict[str, float]:
        with self._counts_lock:
            counts = dict(self._counts)
        return {**counts, **self._cache.stats(), "preempted_steps": 0, "device_lost": float(self._lost is not None),
                "varlen_attention": float(self.varlen)}

    def close(self) -> None:
        self._engine_thread.shutdown(wait=True)
        self._completion_thread.shutdown(wait=True)
        if self._lost is None:
            self._stream.synchronize()
            self._cache.clear()
