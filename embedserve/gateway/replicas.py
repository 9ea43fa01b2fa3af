"""The replica pool: which schedulers exist, which are healthy, which to use.

Owns one gRPC channel per replica, a health watch per replica
(grpc.health.v1 ``Watch``; a broken stream or a non-SERVING status takes the
replica out, SERVING puts it back), each replica's ``Info``, and the choice
of replica for a chunk: least outstanding tokens first, among healthy
replicas with room, ties taken in turn (so requests sent one at a time
still spread over idle replicas). Where replicas come from is a
``ReplicaSource``: a fixed list here (``--upstream``); DNS discovery can
plug in another source that yields new address lists as they change.
A replica is called through its frame socket when it has one
(``embedserve.link``; ``frame_calls=False`` keeps gRPC): beside its socket at
``unix:PATH``, else on the TCP port its ``Info`` names at its ``host:port``.
Its ``FrameKeeper`` opens the channel once its health says SERVING (reopened if
it closes while the replica serves; gRPC carries the calls meanwhile) and closes
it when its health watch breaks, failing the calls in flight on it as a broken
gRPC channel would.
A pool serves one model: a replica whose ``Info`` says it serves something
else (``check_info``: another task or width) stays out of rotation, so a
mis-wired deployment refuses requests instead of answering them from the
wrong model.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Callable, Iterable
from dataclasses import dataclass, field
from typing import Protocol

import grpc
from google.protobuf.message import Message
from grpc_health.v1 import health_pb2, health_pb2_grpc

from embedserve.errors import DeadlineExceeded, Unavailable
from embedserve.link import frames
from embedserve.link.addresses import UNIX_PREFIX, split_host_port
from embedserve.link.auth import call_metadata
from embedserve.link.frame_client import FrameChannel, FrameTarget, ReplicaCallError
from embedserve.link.frame_keeper import FrameKeeper
from embedserve.link.wire import BATCH, INTERACTIVE
from embedserve.protos import inference_pb2, inference_pb2_grpc

log = logging.getLogger(__name__)

# What ``Replica.call`` raises for a call that got no answer: either answers code() and details().
REPLICA_CALL_ERRORS = (grpc.aio.AioRpcError, ReplicaCallError)


def channel_options(ping_s: float) -> tuple[tuple[str, int], ...]:
    """gRPC channel options for one replica.

    ``ping_s``: an HTTP/2 ping every ``ping_s`` seconds, and the connection dropped
    when one goes unanswered for ``ping_s`` (0 turns pings off). A replica that hangs
    (SIGSTOP, a cut link) keeps its TCP connection; without pings its calls and its
    health watch would wait for the request deadline. Dropping the connection fails
    them as UNAVAILABLE, so they are retried elsewhere and the replica leaves rotation.
    The scheduler accepts pings this frequent (scheduler/server.py).
    """
    ping_ms = int(ping_s * 1000)
    pings = () if ping_ms <= 0 else (
        ("grpc.keepalive_time_ms", ping_ms),
        ("grpc.keepalive_timeout_ms", ping_ms),
        ("grpc.http2.ping_timeout_ms", ping_ms),   # what gRPC core enforces for an unanswered ping
        ("grpc.keepalive_permit_without_calls", 1),
        ("grpc.http2.max_pings_without_data", 0))
    return (*pings,
            # Reconnect quickly: a restarted replica should rejoin within about a
            # second, not after gRPC's default backoff of up to two minutes.
            ("grpc.initial_reconnect_backoff_ms", 100),
            ("grpc.min_reconnect_backoff_ms", 100),
            ("grpc.max_reconnect_backoff_ms", 1000),
            ("grpc.max_receive_message_length", frames.MAX_MESSAGE_BYTES),
            ("grpc.max_send_message_length", frames.MAX_MESSAGE_BYTES))


class ReplicaSource(Protocol):
    """Where replica addresses come from; yields the full list whenever it changes."""

    def watch(self) -> AsyncIterator[tuple[str, ...]]: ...


class StaticSource:
    """A fixed list of ``host:port`` addresses (``--upstream``)."""

    def __init__(self, addresses: Iterable[str]) -> None:
        self.addresses = tuple(addresses)

    async def watch(self) -> AsyncIterator[tuple[str, ...]]:
        yield self.addresses


@dataclass(eq=False)
class Replica:
    address: str
    channel: grpc.aio.Channel
    stub: inference_pb2_grpc.InferenceStub
    # Sent on every embedserve.v1 call to this replica: the replica token (embedserve/link/auth.py).
    metadata: tuple[tuple[str, str], ...] = ()
    healthy: bool = False
    info: inference_pb2.InfoResponse | None = None
    # Whether ``info`` is the current process's: asked again after every health watch
    # that ended or call that found it down (it may have restarted, on another frame port).
    info_current: bool = False
    outstanding_tokens: int = 0        # all classes
    batch_outstanding_tokens: int = 0  # of them, the batch class's (docs/priority.md)
    refused_token: bool = False   # its last Info call was UNAUTHENTICATED
    wrong_model: str = ""         # why its Info does not match the pool's model ("": it does)
    watch_task: asyncio.Task | None = field(default=None, repr=False)
    # Keeps its frame channel open while the replica serves (None: no frame calls).
    frame_keeper: FrameKeeper | None = field(default=None, repr=False)

    @property
    def frames(self) -> FrameChannel | None:
        """Its open frame channel, if any."""
        return None if self.frame_keeper is None else self.frame_keeper.channel

    def frame_target(self) -> FrameTarget | None:
        """Where its frame socket is: the Unix path beside its gRPC socket, else the
        TCP port its Info reports on the host of its address; None: call over gRPC."""
        if self.address.startswith(UNIX_PREFIX):
            return frames.frame_socket_path(self.address.removeprefix(UNIX_PREFIX))
        if self.info is None or not self.info.frame_port:
            return None
        host, _ = split_host_port(self.address)
        return host, self.info.frame_port

    async def call(self, rpc: str, request: Message, timeout: float | None, request_id: str) -> Message:
        """One Embed/Score/Ranges call, over the frame channel when it is open, else
        gRPC. Raises one of ``REPLICA_CALL_ERRORS``."""
        channel = self.frames
        if channel is not None and not channel.closed:
            return await channel.call(rpc, request, timeout)
        return await getattr(self.stub, rpc)(
            request, timeout=timeout, metadata=(*self.metadata, ("x-request-id", request_id)))

    @property
    def transport(self) -> str:
        """How its Embed/Score calls travel now: "frames" or "grpc"."""
        return "frames" if self.frames is not None and not self.frames.closed else "grpc"

    def close_frames(self) -> None:
        if self.frame_keeper is not None:
            self.frame_keeper.close()
            self.frame_keeper = None

    def forget_process(self) -> None:
        """The process behind the address may be gone: close its frame channel, and
        ask Info again (its frame port, its instance id) when it next serves."""
        self.close_frames()
        self.info_current = False

    def outstanding_of(self, priority: str) -> int:
        """Tokens of class ``priority`` sent to it and not yet answered."""
        if priority == BATCH:
            return self.batch_outstanding_tokens
        return self.outstanding_tokens - self.batch_outstanding_tokens

    def capacity(self, default: int) -> int:
        if self.info is not None and self.info.max_queue_tokens:
            return min(default, int(self.info.max_queue_tokens))
        return default


class ReplicaPool:
    """Healthy replicas and their load. Lives on one event loop."""

    def __init__(self, source: ReplicaSource, max_outstanding_tokens: int = 65536,
                 backoff_min_s: float = 0.1, backoff_max_s: float = 2.0, ping_s: float = 2.0,
                 replica_token: str | None = None, frame_calls: bool = True,
                 check_info: Callable[[inference_pb2.InfoResponse], str] | None = None) -> None:
        self._source = source
        # A replica's Info -> why it does not serve this pool's model ("": it does).
        self._check_info = check_info
        self._channel_options = channel_options(ping_s)
        self._ping_s = ping_s
        self._call_metadata = call_metadata(replica_token)
        self._replica_token = replica_token
        self._frame_calls = frame_calls
        self._max_outstanding = max_outstanding_tokens
        self._backoff = (backoff_min_s, backoff_max_s)
        self._replicas: dict[str, Replica] = {}
        self._changed = asyncio.Condition()
        self._source_task: asyncio.Task | None = None
        self._ties_turn = 0   # counts choices among equally loaded replicas, for round-robin

    # -- lifecycle ---------------------------------------------------------

    async def start(self) -> None:
        self._source_task = asyncio.create_task(self._follow_source())

    async def close(self) -> None:
        if self._source_task is not None:
            self._source_task.cancel()
        for replica in list(self._replicas.values()):
            await self._remove(replica)

    async def _follow_source(self) -> None:
        async for addresses in self._source.watch():
            for address in addresses:          # in the source's order
                if address not in self._replicas:
                    self._add(address)
            for address in set(self._replicas) - set(addresses):
                await self._remove(self._replicas[address])

    def _add(self, address: str) -> None:
        channel = grpc.aio.insecure_channel(address, options=self._channel_options)
        replica = Replica(address, channel, inference_pb2_grpc.InferenceStub(channel), self._call_metadata)
        replica.watch_task = asyncio.create_task(self._watch_health(replica))
        self._replicas[address] = replica

    async def _remove(self, replica: Replica) -> None:
        self._replicas.pop(replica.address, None)
        if replica.watch_task is not None:
            replica.watch_task.cancel()
        replica.close_frames()
        await replica.channel.close()
        await self._notify()

    async def _watch_health(self, replica: Replica) -> None:
        health = health_pb2_grpc.HealthStub(replica.channel)
        delay = self._backoff[0]
        while True:
            try:
                async for reply in health.Watch(health_pb2.HealthCheckRequest(service="")):
                    serving = reply.status == health_pb2.HealthCheckResponse.SERVING
                    if serving and not replica.info_current:
                        replica.info = await replica.stub.Info(inference_pb2.InfoRequest(), timeout=10,
                                                               metadata=replica.metadata)
                        replica.info_current = True
                        self._check_model(replica)
                    if serving and not replica.wrong_model:
                        await self._keep_frames_open(replica)
                    await self._set_health(replica, serving and not replica.wrong_model)
                    delay = self._backoff[0]
            except grpc.aio.AioRpcError as exc:
                replica.refused_token = exc.code() == grpc.StatusCode.UNAUTHENTICATED
                if replica.refused_token:
                    # Health is open but Info is not: a token mismatch shows here, and
                    # the replica stays out of rotation until it is fixed.
                    log.warning("replica %s refused the gateway's token (--replica-token-file): %s",
                                replica.address, exc.details())
                else:
                    log.debug("health watch of %s ended: %s", replica.address, exc.code())
            # The replica went away or hangs: fail its frame calls now, as its gRPC calls fail.
            replica.forget_process()
            await self._set_health(replica, False)
            await asyncio.sleep(delay)
            delay = min(delay * 2, self._backoff[1])

    async def _keep_frames_open(self, replica: Replica) -> None:
        """Keep the replica's frame channel open, if it has a frame socket
        (embedserve.link.frame_keeper); its first calls already go over it."""
        if not self._frame_calls or replica.frame_target() is None:
            return
        if replica.frame_keeper is None:
            replica.frame_keeper = FrameKeeper(
                replica.address, self._replica_token, keepalive_s=self._ping_s,
                backoff_s=self._backoff[0], target=replica.frame_target,
                instance_id=lambda: replica.info.instance_id if replica.info is not None else "")
        await replica.frame_keeper.start()

    def _check_model(self, replica: Replica) -> None:
        assert replica.info is not None
        reason = self._check_info(replica.info) if self._check_info is not None else ""
        if reason and reason != replica.wrong_model:
            log.warning("replica %s is kept out of rotation: %s", replica.address, reason)
        replica.wrong_model = reason
        if reason:
            # Asked again on its next SERVING, in case it was restarted with the right model.
            replica.info, replica.info_current = None, False

    async def _set_health(self, replica: Replica, healthy: bool) -> None:
        if replica.healthy != healthy:
            log.info("replica %s is %s", replica.address, "up" if healthy else "down")
            replica.healthy = healthy
            await self._notify()

    async def _notify(self) -> None:
        async with self._changed:
            self._changed.notify_all()

    # -- queries -----------------------------------------------------------

    @property
    def replicas(self) -> list[Replica]:
        return list(self._replicas.values())

    def healthy(self) -> list[Replica]:
        return [r for r in self._replicas.values() if r.healthy]

    def info(self) -> inference_pb2.InfoResponse | None:
        """The Info of a healthy replica (all replicas serve the same model)."""
        for replica in self.healthy():
            if replica.info is not None:
                return replica.info
        return None

    async def wait_ready(self, timeout: float) -> bool:
        """Wait until some replica is healthy; for start-up and tests."""
        async def ready() -> None:
            async with self._changed:
                await self._changed.wait_for(lambda: bool(self.healthy()))
        try:
            await asyncio.wait_for(ready(), timeout)
            return True
        except TimeoutError:
            return False

    # -- load balancing ----------------------------------------------------

    async def acquire(self, tokens: int, exclude: frozenset[Replica], deadline: float,
                      priority: str = INTERACTIVE) -> Replica:
        """Reserve ``tokens`` of class ``priority`` on the least loaded healthy replica
        with room for that class.

        Each class has its own room on a replica (the replica queues each class apart,
        each within its max_queue_tokens): a bulk job holding a replica's batch room
        never makes an interactive chunk wait here.

        Waits while every usable replica is full, until ``deadline`` (a
        ``time.monotonic()`` value; then ``DeadlineExceeded``); raises
        ``Unavailable`` at once when no replica is healthy. The caller must
        ``release`` what it acquired.
        """
        async with self._changed:
            while True:
                usable = [r for r in self.healthy() if r not in exclude]
                if not usable:
                    # Every healthy replica failed this chunk already: try one
                    # of them again rather than give up (it came back).
                    usable = self.healthy()
                if not usable and any(r.refused_token for r in self._replicas.values()):
                    raise Unavailable("no replica is ready: replicas refuse the gateway's token "
                                      "(--replica-token-file must name the replicas' token)")
                if not usable and any(r.wrong_model for r in self._replicas.values()):
                    raise Unavailable("no replica is ready: the replicas configured for this model "
                                      "serve another model")
                if not usable:
                    raise Unavailable("no replica is ready")
                least = min(r.outstanding_tokens for r in usable)
                ties = [r for r in usable if r.outstanding_tokens == least]
                best = ties[self._ties_turn % len(ties)]
                held = best.outstanding_of(priority)
                if held == 0 or held + tokens <= best.capacity(self._max_outstanding):
                    best.outstanding_tokens += tokens
                    if priority == BATCH:
                        best.batch_outstanding_tokens += tokens
                    self._ties_turn += 1
                    return best
                remaining = deadline - time.monotonic()
                try:
                    if remaining <= 0:
                        raise TimeoutError
                    await asyncio.wait_for(self._changed.wait(), remaining)
                except TimeoutError:
                    raise DeadlineExceeded("the request timed out waiting for a replica") from None

    async def release(self, replica: Replica, tokens: int, priority: str = INTERACTIVE) -> None:
        replica.outstanding_tokens -= tokens
        if priority == BATCH:
            replica.batch_outstanding_tokens -= tokens
        await self._notify()

    async def mark_down(self, replica: Replica) -> None:
        """Take a replica out after a failed call; its health watch brings it back."""
        await self._set_health(replica, False)
        # Restart the watch so a replica that is in fact fine comes back at once; if it
        # was restarted, its frames are the new process's.
        if replica.watch_task is not None and replica.address in self._replicas:
            replica.watch_task.cancel()
            replica.forget_process()
            replica.watch_task = asyncio.create_task(self._watch_health(replica))

