"""The CUDA execution path: one stream, lazily captured graphs, async results.

Owns running steps on a GPU without blocking the caller: inputs are padded to
a bucket (graphs/buckets.py) and copied host-to-device from pinned memory, the
forward runs eagerly, is captured, or is replayed as the GraphCache decides,
the result is copied device-to-host asynchronously into a pinned buffer, and
a CUDA event marks completion (EventLazyTensor). Steps are issued in order on
one stream, so several may be in flight.

Only CudaGraphBackend here touches torch.cuda graphs; it is the CaptureBackend
that graphs/cache.py's policy drives, and that policy is tested on CPU with a
fake backend. This module itself needs a GPU: bench/gpu_engine.py checks it
(replay vs eager equality, latency).
"""

from __future__ import annotations

import concurrent.futures
from typing import Any

import numpy as np
import torch

from embedserve.engine.batch import Batch, check_batch
from embedserve.engine.graphs.buckets import bucket_forward, bucket_inputs, input_size
from embedserve.engine.graphs.cache import GraphCache
from embedserve.engine.graphs.shapes import BucketKey, bucket_for
from embedserve.engine.lazy import EventLazyTensor, FutureLazyTensor, LazyTensor
from embedserve.engine.modules.forward import Model
from embedserve.model.info import ModelInfo


class CudaGraphBackend:
    """Eager runs, graph capture and replay of ``bucket_forward`` on one stream.

    Each captured bucket owns a static input buffer (the graph reads from its
    fixed address) and the output tensor the graph writes; all graphs share
    one memory pool, which is safe because replays are serialized on a stream.
    """

    def __init__(self, model: Model, pooling: str, stream: Any) -> None:
        self._model = model
        self._pooling = pooling
        self._stream = stream
        self._device = next(model.parameters()).device
        self._pool = torch.cuda.graph_pool_handle()

    def run_eager(self, key: BucketKey, host: torch.Tensor) -> torch.Tensor:
        flat = host.to(self._device, non_blocking=True)
        return bucket_forward(self._model, flat, key, self._pooling)

    def capture(self, key: BucketKey, host: torch.Tensor) -> tuple[Any, torch.Tensor, torch.Tensor]:
        static_input = torch.empty(input_size(key), dtype=torch.int64, device=self._device)
        static_input.copy_(host, non_blocking=True)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self._pool, stream=self._stream):
            static_output = bucket_forward(self._model, static_input, key, self._pooling)
        return graph, static_input, static_output

    def replay(self, key: BucketKey, captured: tuple[Any, torch.Tensor, torch.Tensor],
               host: torch.Tensor) -> torch.Tensor:
        graph, static_input, static_output = captured
        static_input.copy_(host, non_blocking=True)
        graph.replay()
        return static_output

    def release(self, key: BucketKey, captured: tuple[Any, torch.Tensor, torch.Tensor]) -> None:
        captured[0].reset()


class CudaRunner:
    def __init__(self, model: Model, info: ModelInfo, max_graphs: int = 64,
                 max_graph_tokens: int = 8192, max_graph_sequences: int = 256,
                 use_graphs: bool = True) -> None:
        self._model = model
        self._info = info
        self._stream = torch.cuda.Stream(device=next(model.parameters()).device)
        backend = CudaGraphBackend(model, info.pooling, self._stream)
        # A zero graphable range turns graphs off: every step runs eagerly.
        self._cache = GraphCache(backend, max_graphs=max_graphs,
                                 max_tokens=max_graph_tokens if use_graphs else 0,
                                 max_sequences=max_graph_sequences)
        self._counts = {"steps": 0, "failed_steps": 0, "tokens": 0}

    def submit(self, batch: Batch) -> LazyTensor:
        self._counts["steps"] += 1
        try:
            check_batch(batch, self._info)
            key = bucket_for(batch.num_tokens, batch.num_sequences)
            host = torch.from_numpy(bucket_inputs(batch, key, self._model.config.position_offset))
            host = host.pin_memory()
            with torch.cuda.stream(self._stream), torch.inference_mode():
                out = self._cache.run(batch.num_tokens, batch.num_sequences, host)
                result = torch.empty(out[:batch.num_sequences].shape, dtype=torch.float32,
                                     pin_memory=True)
                result.copy_(out[:batch.num_sequences], non_blocking=True)
                event = torch.cuda.Event()
                event.record(self._stream)
        except Exception as exc:
            self._counts["failed_steps"] += 1
            failed: concurrent.futures.Future[np.ndarray] = concurrent.futures.Future()
            failed.set_exception(exc)
            return FutureLazyTensor(failed)
        self._counts["tokens"] += batch.num_tokens
        # Copy out of the pinned buffer so pinned memory returns to its cache.
        return EventLazyTensor(event, lambda: result.numpy().copy())

    def stats(self) -> dict[str, float]:
        return {**self._counts, **self._cache.stats()}

    def close(self) -> None:
        self._stream.synchronize()
        self._cache.clear()
