"""One scheduler replica: the grpc.aio server, its health, reflection, metrics and life cycle.

Owns start-up (bind, warm the engine, then report SERVING), draining and
shutdown. It wires together the pieces that do the work: ``servicer.py``
(the handlers), ``pool.py`` (the queue), ``batcher.py`` (the engine loop),
``metrics.py``. Signals are the entry point's business (``cli.py``); this
module exposes ``drain()`` / ``stop()`` for it and for tests.

    server, port = await create_server(settings, engine)
    ...
    await server.stop()
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

import grpc
import numpy as np
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from embedserve import calibration
from embedserve.engine.batch import Batch
from embedserve.errors import ModelLoadError
from embedserve.link import frames
from embedserve.link.auth import TokenAuthInterceptor
from embedserve.link.frame_server import FrameServer
from embedserve.link.wire import PRIORITIES
from embedserve.protos import inference_pb2, inference_pb2_grpc
from embedserve.scheduler.batcher import Batcher, StepEngine
from embedserve.scheduler.metrics import MetricsEndpoint, SchedulerMetrics
from embedserve.scheduler.pool import RequestPool
from embedserve.scheduler.servicer import InferenceService
from embedserve.scheduler.settings import SchedulerSettings, default_max_batch_tokens
from embedserve.tracing import start_tracer

if TYPE_CHECKING:
    from embedserve.otel import Tracer

log = logging.getLogger(__name__)

SERVICE_NAME = inference_pb2.DESCRIPTOR.services_by_name["Inference"].full_name
_SERVING = health_pb2.HealthCheckResponse.SERVING
_NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING
_MESSAGE_SLACK = 64 * 1024  # protobuf framing, request ids
# A connection (gRPC or frames) that has not finished its handshake (HTTP/2's preface;
# frames' HELLO) in this time is closed: a gateway on a working network needs milliseconds.
HANDSHAKE_TIMEOUT_S = 5.0


class SchedulerServer:
    """A started replica. ``port`` / ``metrics_port`` are the bound ports.

    ``on_device_lost`` runs once when a step fails with DeviceLost (a poisoned
    CUDA context): by then the replica reports NOT_SERVING and refuses new
    calls; the caller is expected to stop it and exit non-zero, so that its
    supervisor starts a fresh process. ``device_lost`` says whether it happened.
    """

    def __init__(self, settings: SchedulerSettings, engine: StepEngine,
                 on_device_lost: Callable[[], None] | None = None,
                 tracer: Tracer | None = None) -> None:
        info = engine.info
        max_batch_tokens = settings.max_batch_tokens or default_max_batch_tokens(settings.device, info.dtype)
        settings = dataclasses.replace(settings, max_batch_tokens=max_batch_tokens)
        if settings.max_queue_tokens < info.max_positions:
            # Every valid sequence must fit an empty queue, or it could never run.
            raise ValueError(f"max_queue_tokens ({settings.max_queue_tokens}) is below the "
                             f"model's max_positions ({info.max_positions})")
        self.settings = settings
        self.engine = engine
        self.metrics = SchedulerMetrics(engine.stats)
        self.pool = RequestPool(settings.max_queue_tokens,
                                batch_token_cap=settings.batch_tokens_while_interactive,
                                interactive_window_s=settings.interactive_window_s)
        # Spans of each call (docs/tracing.md): ``tracer`` (tests), else one exporting as
        # ``settings.tracing`` says, shut down (flushed) by ``stop``; None: no tracing.
        self._owns_tracer = tracer is None
        self.tracer = tracer if tracer is not None else start_tracer(settings.tracing)
        self.service = InferenceService(engine, self.pool, settings, self.metrics, self.tracer)
        self.batcher = Batcher(engine, self.pool, info.task, max_batch_tokens,  # type: ignore[arg-type]  # task: checked at load
                               settings.max_batch_sequences, settings.in_flight_depth,
                               self.metrics, on_device_lost=self._device_lost,
                               preempt=settings.preempt_batch_steps)
        self.device_lost = False
        self._on_device_lost = on_device_lost
        self._health_tasks: set[asyncio.Task] = set()
        pool, service, batcher = self.pool, self.service, self.batcher
        self.metrics.track_state(lambda: pool.queued_sequences, lambda: pool.queued_tokens,
                                 lambda: service.active_calls, lambda: batcher.in_flight)
        self.metrics.track_class_queues(pool.queued_tokens_of, PRIORITIES)
        self.health = health.aio.HealthServicer()
        # A call can carry at most max_queue_tokens tokens (ids + segment ids
        # + lengths, 4 bytes each) and get back as many rows of float32.
        tokens = settings.max_queue_tokens
        max_request_bytes = 12 * tokens + _MESSAGE_SLACK
        # gRPC takes a C int; a sparse model's "dimension" (its vocabulary) would pass it,
        # though its answers carry only nonzeros.
        max_reply_bytes = min(2**31 - 1, 4 * tokens * max(1, info.dimension) + _MESSAGE_SLACK)
        options = [("grpc.max_receive_message_length", max_request_bytes),
                   ("grpc.max_send_message_length", max_reply_bytes),
                   ("grpc.so_reuseport", 0),
                   # The gateway pings every 2 s to notice a hung replica (see
                   # gateway/replicas.py); the default policy would answer GOAWAY.
                   ("grpc.keepalive_permit_without_calls", 1),
                   ("grpc.http2.min_recv_ping_interval_without_data_ms", 1000),
                   ("grpc.http2.max_ping_strikes", 0),
                   # A connection that has not finished HTTP/2's preface in this time is
                   # closed (the default, 120 s, lets idle connections pile up).
                   ("grpc.server_handshake_timeout_ms", int(HANDSHAKE_TIMEOUT_S * 1000))]
        # Vectors beyond this would not fit a message the gateway takes (either transport).
        self.service.max_reply_bytes = min(4 * tokens * max(1, info.dimension),
                                           frames.MAX_MESSAGE_BYTES - _MESSAGE_SLACK)
        interceptors = [TokenAuthInterceptor(settings.replica_token)] if settings.replica_token else []
        self.grpc_server = grpc.aio.server(options=options, interceptors=interceptors,
                                           maximum_concurrent_rpcs=settings.max_concurrent_rpcs)
        # Beside the Unix socket: the same calls, cheaper (embedserve/link/frames.py).
        self.frame_server = FrameServer(self.service, settings.replica_token, max_request_bytes,
                                        settings.max_concurrent_rpcs,
                                        max_connections=settings.max_frame_connections,
                                        handshake_timeout_s=HANDSHAKE_TIMEOUT_S)
        inference_pb2_grpc.add_InferenceServicer_to_server(self.service, self.grpc_server)
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self.grpc_server)
        reflection.enable_server_reflection(
            (SERVICE_NAME, health.SERVICE_NAME, reflection.SERVICE_NAME), self.grpc_server)
        self.port = 0
        self.metrics_port: int | None = None
        self._metrics_endpoint: MetricsEndpoint | None = None
        self._stopped = False

    async def start(self) -> int:
        """Bind, warm the engine, start batching, then report SERVING. Returns the port."""
        await self._set_health(_NOT_SERVING)
        address = f"{self.settings.host}:{self.settings.port}"
        try:
            self.port = self.grpc_server.add_insecure_port(address)
        except RuntimeError as error:
            raise OSError(f"cannot bind the scheduler to {address}: {error}") from error
        if self.port == 0:
            raise OSError(f"cannot bind the scheduler to {address}")
        if self.settings.unix_socket is not None:
            target = f"unix:{self.settings.unix_socket}"
            try:
                bound = self.grpc_server.add_insecure_port(target)
            except RuntimeError as error:
                raise OSError(f"cannot bind the scheduler to {target}: {error}") from error
            if bound == 0:
                raise OSError(f"cannot bind the scheduler to {target}")
            await self.frame_server.start_unix(frames.frame_socket_path(self.settings.unix_socket))
        if self.settings.frame_port is not None:
            self.service.frame_port = await self._start_frames_tcp(self.settings.frame_port)
        await self.grpc_server.start()
        if self.settings.metrics_port is not None:
            self._metrics_endpoint = MetricsEndpoint(self.metrics.registry, self.settings.host,
                                                     self.settings.metrics_port)
            self.metrics_port = self._metrics_endpoint.port
        await self._warm_up()
        await self._calibrate()
        self.batcher.start()
        self.service.accepting = True
        await self._set_health(_SERVING)
        return self.port

    async def _start_frames_tcp(self, port: int) -> int:
        try:
            return await self.frame_server.start_tcp(self.settings.host, port)
        except OSError as error:
            raise OSError(f"cannot bind the frame socket to {self.settings.host}:{port}: "
                          f"{error.strerror or error}") from error

    async def drain(self, timeout_s: float | None = None) -> bool:
        """NOT_SERVING, refuse new calls (UNAVAILABLE), wait for calls in flight.

        Returns False if calls were still running when ``timeout_s`` ran out.
        """
        self.service.accepting = False
        await self._set_health(_NOT_SERVING)
        timeout_s = self.settings.drain_timeout_s if timeout_s is None else timeout_s
        try:
            await asyncio.wait_for(self.service.wait_idle(), timeout_s)
        except TimeoutError:
            log.warning("drain: %d calls still running after %.1f s",
                        self.service.active_calls, timeout_s)
            return False
        return True

    async def stop(self, drain_timeout_s: float | None = None) -> None:
        """Drain, then stop the server, the batching loop and the metrics endpoint."""
        if self._stopped:
            return
        self._stopped = True
        await self.drain(drain_timeout_s)
        await asyncio.gather(self.grpc_server.stop(grace=1.0), self.frame_server.stop(grace_s=1.0))
        await self.batcher.stop()
        if self._metrics_endpoint is not None:
            self._metrics_endpoint.close()
        if self.tracer is not None and self._owns_tracer:
            await asyncio.to_thread(self.tracer.shutdown)   # sends the spans still batched

    async def _warm_up(self) -> None:
        """One real step before SERVING: first-call costs (allocations, kernels) happen here."""
        info = self.engine.info
        length = min(8, info.max_positions)
        ids = (np.arange(2 * length) % info.vocab_size).astype(np.int32)
        batch = Batch.from_lengths(ids, np.array([length, length], dtype=np.int32),
                                   info.task)  # type: ignore[arg-type]  # a Task: checked at load
        try:
            await self.engine.step(batch)
        except Exception as error:
            raise ModelLoadError(f"the engine failed its warm-up step: {error}") from error

    async def _calibrate(self) -> None:
        """Read the model's int8/uint8 calibration, or compute and store it (once per
        model and dtype in the cache; later starts and other replicas read the file)."""
        info, cache_dir = self.engine.info, self.settings.calibration_cache_dir
        if cache_dir is None or info.task != "embed":
            return
        directory = calibration.calibration_dir(cache_dir, self.settings.model_dir, info.dtype or "")
        try:
            found = await asyncio.to_thread(calibration.load_calibration, directory)
            if found is None:
                log.info("calibrating int8/uint8 ranges into %s (once per model and dtype)",
                         directory)
                assert self.settings.max_batch_tokens is not None   # resolved in __init__
                batches = await asyncio.to_thread(
                    calibration.calibration_batches, self.settings.model_dir, info,
                    self.settings.max_batch_tokens, self.settings.max_batch_sequences)
                rows = [await self.engine.step(Batch.of(tokens)) for tokens in batches]
                found = await asyncio.to_thread(calibration.store_calibration, directory,
                                                np.concatenate(rows, axis=0),
                                                self.settings.model_dir, info)
        except Exception as error:
            # float and binary need no calibration: serve them, refuse int8/uint8 saying why.
            log.warning("no int8/uint8 calibration: %s", error)
            self.service.calibration_error = f"calibration failed at start-up: {error}"
            return
        self.service.set_calibration(found)

    def _device_lost(self, error: Exception) -> None:
        if self.device_lost:
            return
        self.device_lost = True
        log.critical("the device is lost (%s): NOT_SERVING; the replica stops", error)
        self.service.accepting = False
        task = asyncio.get_running_loop().create_task(self._set_health(_NOT_SERVING))
        self._health_tasks.add(task)
        task.add_done_callback(self._health_tasks.discard)
        if self._on_device_lost is not None:
            self._on_device_lost()

    async def _set_health(self, status: int) -> None:
        for name in ("", SERVICE_NAME):
            await self.health.set(name, status)


async def create_server(settings: SchedulerSettings, engine: StepEngine,
                        on_device_lost: Callable[[], None] | None = None,
                        tracer: Tracer | None = None) -> tuple[SchedulerServer, int]:
    """Build and start a replica around a loaded engine; returns it and its port.
    ``tracer``: its spans' (tests); default: as ``settings.tracing`` says."""
    server = SchedulerServer(settings, engine, on_device_lost, tracer)
    try:
        port = await server.start()
    except BaseException:
        await server.grpc_server.stop(grace=None)
        await server.frame_server.stop(grace_s=0)
        if server._metrics_endpoint is not None:
            server._metrics_endpoint.close()
        raise
    return server, port
