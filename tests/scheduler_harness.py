"""Test harness for the scheduler tests: a real server on its own event loop thread.

``ThreadedScheduler`` runs ``create_server`` on a background asyncio loop so
tests can use the ordinary (synchronous) grpc client, including
``stub.Embed.future(...)`` for hundreds of concurrent calls, ``.cancel()``
and per-call timeouts. ``RecordingEngine`` wraps a real Engine: it delegates
every step to it, records which sequences were stepped, and can hold steps
behind a gate (to keep calls queued) or fail one step. It computes nothing
itself.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
import time
from collections.abc import Callable

import grpc
import numpy as np

from embedserve.engine.lazy import FutureLazyTensor
from embedserve.protos import inference_pb2, inference_pb2_grpc
from embedserve.scheduler.server import SchedulerServer, create_server
from embedserve.scheduler.settings import SchedulerSettings

GATE_TIMEOUT_S = 30.0  # a test that forgets to open the gate fails instead of hanging


class RecordingEngine:
    """A decorator over a real Engine: same results, plus a log of stepped sequences."""

    def __init__(self, engine) -> None:
        self._engine = engine
        self.info = engine.info
        self.stepped: list[tuple[int, ...]] = []   # every sequence stepped, in order
        self.batches: list = []                     # every Batch stepped, in order
        self.steps = 0
        self.inline_asked: list[bool] = []          # each step's ``inline``, in order
        self.gate = threading.Event()
        self.gate.set()
        self.fail_next: Exception | None = None
        # One worker keeps steps in submission order, like the engine's own.
        self._executor = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="recording")

    def step(self, batch, inline: bool = False):
        # ``inline`` is recorded, not honoured: the gate holds steps on this decorator's worker.
        self.inline_asked.append(inline)
        cu = batch.cu_seqlens
        self.stepped.extend(tuple(batch.token_ids[cu[i]:cu[i + 1]].tolist())
                            for i in range(batch.num_sequences))
        self.steps += 1
        self.batches.append(batch)
        failure, self.fail_next = self.fail_next, None
        return FutureLazyTensor(self._executor.submit(self._run, batch, failure))

    def _run(self, batch, failure: Exception | None) -> np.ndarray:
        if not self.gate.wait(GATE_TIMEOUT_S):
            raise TimeoutError("the test never opened the gate")
        if failure is not None:
            raise failure
        return self._engine.step(batch).wait()

    def stats(self) -> dict[str, float]:
        return self._engine.stats()

    def close(self) -> None:
        self.gate.set()
        self._executor.shutdown(wait=True)


class ThreadedScheduler:
    """A started SchedulerServer on a private event loop thread, with a sync channel."""

    def __init__(self, settings: SchedulerSettings, engine, tracer=None) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self._thread.start()
        self.server: SchedulerServer
        self.server, self.port = self.call(create_server(settings, engine, tracer=tracer))
        self.channel = grpc.insecure_channel(f"127.0.0.1:{self.port}")
        self.stub = inference_pb2_grpc.InferenceStub(self.channel)

    def call(self, coroutine, timeout: float = 60.0):
        """Run a coroutine on the server's loop and return its result."""
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(timeout)

    def submit(self, coroutine) -> concurrent.futures.Future:
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop)

    def counter(self, name: str, **labels: str) -> float:
        value = self.server.metrics.registry.get_sample_value(name, labels)
        return 0.0 if value is None else value

    def close(self) -> None:
        self.channel.close()
        try:
            self.call(self.server.stop(drain_timeout_s=5.0))
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(10)
            self.loop.close()

    def __enter__(self) -> ThreadedScheduler:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def wait_until(condition: Callable[[], bool], timeout: float = 20.0, what: str = "") -> None:
    """Wait for state another thread or process changes (not a timing assertion)."""
    end = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > end:
            raise AssertionError(f"timed out waiting for {what or condition}")
        time.sleep(0.005)


def embed_request(sequences: list[np.ndarray] | list[list[int]], **options) -> inference_pb2.EmbedRequest:
    from embedserve import ragged
    from embedserve.link import wire

    return inference_pb2.EmbedRequest(tokens=wire.pack_tokens(ragged.from_sequences(sequences)),
                                      **options)


def random_sequences(rng: np.random.Generator, count: int, min_len: int, max_len: int,
                     vocab: int = 250_002) -> list[np.ndarray]:
    return [rng.integers(3, vocab, size=int(rng.integers(min_len, max_len + 1))).astype(np.int32)
            for _ in range(count)]
