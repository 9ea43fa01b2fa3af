"""The CPU execution path: steps run in submission order, on one worker thread or inline.

``submit(batch, inline=True)`` runs the step on the calling thread, after any steps
queued before it, and returns it finished. A replica's event loop does this for calls
that came over frames: with every core in the step's OpenMP team, work the loop did
during a step on the worker took a core from that team and stalled it at its next
barrier, and each step cost two thread hand-offs (BENCHMARKS.md, Scheduler, "Steps on
the replica's event loop").

Each step's token count is rounded up to a bucket (``cpu_shapes.py``) unless the
runner is built with ``token_buckets=False``: a few step shapes keep oneDNN's
per-shape primitives, and so the replica's memory, bounded under mixed traffic.
A model whose linears all run on a native kernel (avx2_linear or bf16_linear:
``onednn.linears_all_native``), or on amx_linear for calls of few rows, keeps no
primitives for short steps (``onednn.linears_native_up_to``): its steps of up to 64
tokens run exact counts, so a 20-token query computes 20 rows, not 24. Larger steps keep their
buckets: with exact counts up to 512 such a replica still grew by ~130 MB over 400
mixed steps (about 25 MB with buckets; cause not identified), where 64 exact counts
added ~13 MB and stayed there.

``submit(batch, preempt=True)`` queues an urgent step: it runs at the next layer
boundary of the step being computed, which then resumes (``preemption.py``), or
before the next step if none is running. The scheduler sends interactive steps so
while a batch step is in the engine (docs/priority.md).
"""

from __future__ import annotations

import concurrent.futures
import threading
from collections.abc import Callable

import numpy as np
import torch

from embedserve.engine.batch import Batch, check_batch
from embedserve.engine.cpu_shapes import pad_to_bucket
from embedserve.engine.graphs.shapes import TOKEN_STEP_SMALL
from embedserve.engine.lazy import FutureLazyTensor, LazyTensor
from embedserve.engine.modules.attention import ATTENTION_IMPLS, key_limited
from embedserve.engine.modules.forward import Model, forward_with_token_states, pooled_forward
from embedserve.engine.modules.layout import build_layout
from embedserve.engine.onednn import linears_native_up_to
from embedserve.engine.runners.preemption import LayerPreemption
from embedserve.engine.small_steps import SmallStepForward
from embedserve.engine.token_rows import pooled_and_states, token_rows
from embedserve.errors import InvalidInput, ModelLoadError
from embedserve.model.info import ModelInfo

# Chosen by measurement on CPU (BENCHMARKS.md, engine section).
DEFAULT_CPU_ATTENTION = "per_sequence"


class CpuRunner:
    """Runs steps in submission order: on one dedicated worker thread, or inline on the
    thread that submits them."""

    def __init__(self, model: Model, info: ModelInfo, attention: str | None = None,
                 token_buckets: bool = True, small_steps: bool = True) -> None:
        attention = attention or DEFAULT_CPU_ATTENTION
        if attention not in ATTENTION_IMPLS:
            raise ModelLoadError(f"unknown attention {attention!r}; choose from {sorted(ATTENTION_IMPLS)}")
        self._model = model
        self._info = info
        self._attention = ATTENTION_IMPLS[attention]
        # Steps of few tokens in one flat loop where it covers the model (small_steps.py).
        self._small = SmallStepForward.for_model(model, info.pooling, attention) if small_steps else None
        self._executor = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="embedserve-engine")
        self._last_queued: concurrent.futures.Future | None = None
        self._token_buckets = token_buckets
        self._exact_up_to = min(TOKEN_STEP_SMALL, linears_native_up_to(model))
        self._counts = {"steps": 0, "failed_steps": 0, "tokens": 0, "eager_runs": 0}
        self._padded_tokens = 0   # tokens run, padding included
        self._preemption = LayerPreemption(self._run)
        # Held while a thread computes a step (the worker, or an inline caller): an urgent
        # step's own job never runs beside an inline step, whose layers run it instead.
        self._computing = threading.Lock()
        self.preempts_steps = self._preemption.install(model) > 0

    def submit(self, batch: Batch, inline: bool = False, preempt: bool = False) -> LazyTensor:
        if preempt and self.preempts_steps:
            urgent = self._preemption.push(batch)
            # Where no layer boundary comes first, it runs as a job of its own.
            self._last_queued = self._executor.submit(self._run_urgent)
            return FutureLazyTensor(urgent)
        if inline:
            if self._last_queued is not None:
                # In submission order, and never two steps on the OpenMP threads at once.
                concurrent.futures.wait([self._last_queued])
            return FutureLazyTensor(_run_here(self._run_queued, batch))
        self._last_queued = self._executor.submit(self._run_queued, batch)
        return FutureLazyTensor(self._last_queued)

    def _run_queued(self, batch: Batch) -> np.ndarray:
        with self._computing:
            self._preemption.run_pending()   # urgent steps go before the steps queued ahead of them
            return self._run(batch)

    def _run_urgent(self) -> None:
        with self._computing:
            self._preemption.run_pending()

    def _run(self, batch: Batch) -> np.ndarray:
        self._counts["steps"] += 1
        try:
            check_batch(batch, self._info)
            padded = self._token_buckets and batch.num_tokens > self._exact_up_to
            run = pad_to_bucket(batch, self._info.max_positions) if padded else batch
            with torch.inference_mode():
                if batch.token_states:
                    pooled, states = self._forward_with_states(run)
                    out = pooled_and_states(pooled, states, batch.cu_seqlens)
                elif self._info.task == "multivector":
                    out = token_rows(self._forward(run), batch.cu_seqlens)   # one [L, dim] per sequence
                else:
                    out = self._forward(run)[:batch.num_sequences]           # the padding's rows dropped
        except BaseException:
            self._counts["failed_steps"] += 1
            raise
        self._counts["tokens"] += batch.num_tokens
        self._padded_tokens += run.num_tokens
        self._counts["eager_runs"] += 1
        return out

    def _forward(self, batch: Batch) -> np.ndarray:
        if self._small is not None and self._small.covers(batch) and batch.key_lengths is None:
            return self._small.run(batch)
        return pooled_forward(*self._inputs(batch)).numpy()

    def _forward_with_states(self, batch: Batch) -> tuple[np.ndarray, np.ndarray]:
        """The step's rows and every token's last hidden state, from one encoder pass."""
        pooled, states = forward_with_token_states(*self._inputs(batch))
        return pooled.numpy(), states.numpy()

    def _inputs(self, batch: Batch) -> tuple:
        """``batch`` as the forward functions' arguments."""
        layout = build_layout(batch.cu_seqlens)
        token_ids = torch.from_numpy(batch.token_ids.astype(np.int64))
        positions = torch.from_numpy(layout.offsets + self._model.config.position_offset)
        types = (torch.zeros_like(token_ids) if batch.token_type_ids is None
                 else torch.from_numpy(batch.token_type_ids.astype(np.int64)))
        starts = torch.from_numpy(batch.cu_seqlens[:-1].astype(np.int64))
        kind = self._model.attention_kind
        if batch.key_lengths is not None:       # ColBERT query expansion (model/multivector.py)
            if not kind.is_full:
                raise InvalidInput("key_lengths need a bidirectional encoder", field="key_lengths")
            attend = key_limited(layout, torch.from_numpy(batch.key_lengths.astype(np.int64)))
        else:
            attend = self._attention(layout, causal=kind.causal, window=kind.window)
        return (self._model, token_ids, positions, types, layout.seq_ids_tensor, layout.lengths_tensor,
                starts, attend, self._info.pooling)

    def stats(self) -> dict[str, float]:
        # The same keys as the CUDA runner's, so metrics code needs no device check.
        padded, real = self._padded_tokens, self._counts["tokens"]
        return {**self._counts, "preempted_steps": self._preemption.preempted, "captures": 0, "replays": 0,
                "evictions": 0, "capture_failures": 0, "capture_time_s": 0.0, "graphs": 0,
                "padding_waste": (padded - real) / padded if padded else 0.0}

    def close(self) -> None:
        # Queued steps are cancelled: their LazyTensors raise concurrent.futures.CancelledError.
        self._executor.shutdown(wait=True, cancel_futures=True)
        self._preemption.cancel_pending()


def _run_here(run: Callable[[Batch], np.ndarray], batch: Batch) -> concurrent.futures.Future:
    """``run(batch)`` on this thread, as a finished future: its rows, or the error it raised."""
    future: concurrent.futures.Future = concurrent.futures.Future()
    try:
        future.set_result(run(batch))
    except Exception as error:
        future.set_exception(error)
    return future
