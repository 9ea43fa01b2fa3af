"""The CPU execution path: steps run in submission order, on worker threads (lanes) or inline.

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

Up to ``lanes`` submitted steps are computed side by side, on a worker thread each
(default 2 where torch has 2 threads or more): a step alone gets every core, two get
half each (``thread_share.py``). One step on every core left cores idle whenever its
thread ran serial code, and a core another process took stalled its whole team; a
bulk job through ``serve`` on 2 cores ran 1.2-1.6x faster with two lanes
(docs/priority.md, "Lanes"). A replica's lane threads run ``lane_nice`` below the rest.

``submit(batch, preempt=True)`` queues an urgent step (the scheduler sends interactive
steps so while a batch step is in the engine, docs/priority.md). With lanes it starts
at once on a thread of its own, beside them, on its share of the cores and ahead of
them in CPU priority; with one lane it runs at the next layer boundary of the step
being computed, which then resumes (``preemption.py``), or before the next step if
none is running.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import functools
import os
import threading
from collections.abc import Callable

import numpy as np
import torch

from embedserve.engine import heap
from embedserve.engine.batch import Batch, check_batch
from embedserve.engine.cpu_shapes import pad_to_bucket
from embedserve.engine.graphs.shapes import TOKEN_STEP_SMALL
from embedserve.engine.lazy import FutureLazyTensor, LazyTensor
from embedserve.engine.modules.attention import ATTENTION_IMPLS, key_limited
from embedserve.engine.modules.forward import Model, forward_with_token_states, pooled_forward
from embedserve.engine.modules.layout import build_layout
from embedserve.engine.onednn import linears_native_up_to
from embedserve.engine.runners.preemption import LayerPreemption
from embedserve.engine.runners.thread_share import ThreadShare
from embedserve.engine.small_steps import SmallStepForward
from embedserve.engine.token_rows import pooled_and_states, token_rows
from embedserve.errors import InvalidInput, ModelLoadError
from embedserve.model.info import ModelInfo

# Chosen by measurement on CPU (BENCHMARKS.md, engine section).
DEFAULT_CPU_ATTENTION = "per_sequence"


class CpuRunner:
    """Runs steps in submission order: on up to ``lanes`` worker threads side by side, or
    inline on the thread that submits them (alone on the cores)."""

    def __init__(self, model: Model, info: ModelInfo, attention: str | None = None,
                 token_buckets: bool = True, small_steps: bool = True, lanes: int | None = None,
                 lane_nice: int = 0, small_step_threads: int | None = None, small_step_helper: bool = True) -> None:
        attention = attention or DEFAULT_CPU_ATTENTION
        if attention not in ATTENTION_IMPLS:
            raise ModelLoadError(f"unknown attention {attention!r}; choose from {sorted(ATTENTION_IMPLS)}")
        self._model = model
        self._info = info
        self._attention = ATTENTION_IMPLS[attention]
        # Steps free and allocate the same large blocks: glibc keeps them instead of
        # unmapping them, so a step does not fault its activations' pages in anew (heap.py).
        heap.keep_freed_blocks()
        # Steps of few tokens in one flat loop where it covers the model (small_steps.py).
        self._small = SmallStepForward.for_model(model, info.pooling, attention) if small_steps else None
        # The flat loop's threads (None: the step's share): a replica runs them on one
        # (scheduler/settings.py, REPLICA_SMALL_STEP_THREADS says why).
        self._small_threads = small_step_threads
        # On one thread, a step alone on the cores takes bf16_linear's helper thread for its
        # linears (csrc/helper_team.h: no OpenMP pool to wake); False: benchmarks A/B.
        self._small_helper = small_step_helper and small_step_threads == 1
        # The cores between the steps computed at once (thread_share.py): a step alone
        # gets them all; up to ``lanes`` steps run side by side, on a worker thread each.
        self._share = ThreadShare(torch.get_num_threads())
        self.lanes = lanes if lanes is not None else default_lanes(self._share.threads)
        if self.lanes < 1:
            raise ValueError(f"lanes must be at least 1, got {self.lanes}")
        # ``lane_nice``: the lanes' threads' nice value, added to the process's (a replica's
        # lanes compute batch steps: they yield the cores to the threads that answer queries).
        self._executor = concurrent.futures.ThreadPoolExecutor(
            self.lanes, thread_name_prefix="embedserve-engine",
            initializer=functools.partial(lower_cpu_priority, lane_nice) if self.lanes > 1 and lane_nice > 0 else None)
        # With lanes, an urgent step starts at once on a thread of its own, beside them
        # (and ahead of them where they run at a lane_nice); with one, at a layer boundary.
        self._urgent_executor = (concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="embedserve-urgent")
                                 if self.lanes > 1 else self._executor)
        self._beside = 0   # urgent steps started while a lane computed a step
        self._queued: set[concurrent.futures.Future] = set()   # submitted and not finished
        self._queued_lock = threading.Lock()
        self._counts_lock = threading.Lock()
        self._token_buckets = token_buckets
        self._exact_up_to = min(TOKEN_STEP_SMALL, linears_native_up_to(model))
        self._counts = {"steps": 0, "failed_steps": 0, "tokens": 0, "eager_runs": 0}
        self._padded_tokens = 0   # tokens run, padding included
        self._preemption = LayerPreemption(self._run)
        # On one lane, held while an inline step or an urgent step's own job computes: the
        # two never run side by side (an inline step's layers run the urgent step instead).
        # With lanes an urgent step runs beside any step, as it does beside the lanes'.
        self._computing: contextlib.AbstractContextManager = (
            threading.Lock() if self.lanes == 1 else contextlib.nullcontext())
        if self.lanes > 1:
            self._share.install(model)
            self.preempts_steps = True
        else:
            self.preempts_steps = self._preemption.install(model) > 0

    def submit(self, batch: Batch, inline: bool = False, preempt: bool = False) -> LazyTensor:
        if preempt and self.preempts_steps:
            urgent = self._preemption.push(batch)
            # With lanes, on the urgent thread at once; with one, where no layer boundary
            # comes first, as a job of its own.
            self._queue(self._run_urgent, executor=self._urgent_executor)
            return FutureLazyTensor(urgent)
        if inline:
            with self._queued_lock:
                queued = list(self._queued)
            # After the steps submitted before it, and alone on the cores.
            concurrent.futures.wait(queued)
            with self._computing:
                return FutureLazyTensor(_run_here(self._run_queued, batch))
        return FutureLazyTensor(self._queue(self._run_on_lane, batch))

    def _queue(self, job: Callable[..., object], *args: object,
               executor: concurrent.futures.Executor | None = None) -> concurrent.futures.Future:
        future = (executor or self._executor).submit(job, *args)
        with self._queued_lock:
            self._queued.add(future)
        future.add_done_callback(self._finished)
        return future

    def _finished(self, future: concurrent.futures.Future) -> None:
        with self._queued_lock:
            self._queued.discard(future)

    def _run_queued(self, batch: Batch) -> np.ndarray:
        self._preemption.run_pending()   # urgent steps go before the steps queued ahead of them
        return self._run(batch)

    def _run_on_lane(self, batch: Batch) -> np.ndarray:
        # With lanes the urgent thread runs the urgent steps (a lane would, at its priority).
        return self._run_queued(batch) if self.lanes == 1 else self._run(batch)

    def _run_urgent(self) -> None:
        with self._computing:
            beside = self.lanes > 1 and self._share.computing > 0
            self._preemption.run_pending(self._count_beside if beside else None)

    def _count_beside(self) -> None:
        with self._counts_lock:
            self._beside += 1

    def _run(self, batch: Batch) -> np.ndarray:
        self._count("steps", 1)
        try:
            check_batch(batch, self._info)
            padded = self._token_buckets and batch.num_tokens > self._exact_up_to
            run = pad_to_bucket(batch, self._info.max_positions) if padded else batch
            with torch.inference_mode(), self._share.step():
                if batch.token_states:
                    pooled, states = self._forward_with_states(run)
                    out = pooled_and_states(pooled, states, batch.cu_seqlens)
                elif self._info.task == "multivector":
                    out = token_rows(self._forward(run), batch.cu_seqlens)   # one [L, dim] per sequence
                else:
                    out = self._forward(run)[:batch.num_sequences]           # the padding's rows dropped
        except BaseException:
            self._count("failed_steps", 1)
            raise
        with self._counts_lock:
            self._counts["tokens"] += batch.num_tokens
            self._padded_tokens += run.num_tokens
            self._counts["eager_runs"] += 1
        return out

    def _count(self, key: str, amount: int) -> None:
        with self._counts_lock:
            self._counts[key] += amount

    def _forward(self, batch: Batch) -> np.ndarray:
        if self._small is not None and self._small.covers(batch) and batch.key_lengths is None:
            # bf16_linear's helper thread only where this step has two cores or more to itself
            helper = self._small_helper and self._share.share() >= 2
            # A fixed team (torch's own ops in the step too), else the step's share.
            with (self._share.fixed(self._small_threads) if self._small_threads else contextlib.nullcontext()):
                return self._small.run(batch, helper=helper)
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
        return {**self._counts, "preempted_steps": self._preemption.preempted + self._beside,
                "captures": 0, "replays": 0, "evictions": 0, "capture_failures": 0, "capture_time_s": 0.0, "graphs": 0,
                "padding_waste": (padded - real) / padded if padded else 0.0}

    def close(self) -> None:
        # Queued steps are cancelled: their LazyTensors raise concurrent.futures.CancelledError.
        self._executor.shutdown(wait=True, cancel_futures=True)
        self._urgent_executor.shutdown(wait=True, cancel_futures=True)
        self._preemption.cancel_pending()


def lower_cpu_priority(nice: int) -> None:
    """A lane thread's start: ``nice`` below the threads that answer queries in CPU priority."""
    with contextlib.suppress(OSError):   # raising one's own nice needs no privilege; never fatal
        thread = threading.get_native_id()
        os.setpriority(os.PRIO_PROCESS, thread, os.getpriority(os.PRIO_PROCESS, thread) + nice)


def default_lanes(threads: int) -> int:
    """Steps computed side by side by default: two where there are two cores or more."""
    return 2 if threads >= 2 else 1


def _run_here(run: Callable[[Batch], np.ndarray], batch: Batch) -> concurrent.futures.Future:
    """``run(batch)`` on this thread, as a finished future: its rows, or the error it raised."""
    future: concurrent.futures.Future = concurrent.futures.Future()
    try:
        future.set_result(run(batch))
    except Exception as error:
        future.set_exception(error)
    return future
