"""One cap on the calls a replica serves at once, over gRPC and frames together
(``max_concurrent_rpcs``, checked where both transports' calls meet: the servicer)."""

from __future__ import annotations

import asyncio
import tempfile
from pathlib import Path

import grpc
import pytest

from embedserve.link import frames
from embedserve.link.frame_client import FrameChannel, ReplicaCallError
from embedserve.scheduler.settings import SchedulerSettings
from scheduler_harness import RecordingEngine, ThreadedScheduler, embed_request, wait_until

TOKEN = "cap-test-token"
METADATA = (("authorization", f"Bearer {TOKEN}"),)


def test_calls_over_grpc_and_frames_share_one_cap(bert_engine, tiny_bert_dir):
    recorder = RecordingEngine(bert_engine)
    with tempfile.TemporaryDirectory(prefix="es-") as directory:
        settings = SchedulerSettings(model_dir=tiny_bert_dir, unix_socket=Path(directory) / "r.sock",
                                     replica_token=TOKEN, max_batch_tokens=64, in_flight_depth=1,
                                     max_concurrent_rpcs=2)
        with ThreadedScheduler(settings, recorder) as server:
            recorder.gate.clear()
            # One call over gRPC held in the engine, one over frames waiting behind it: two.
            held_grpc = server.stub.Embed.future(embed_request([[5, 6, 7]]), timeout=60, metadata=METADATA)
            wait_until(lambda: server.server.service.active_calls == 1, what="the gRPC call active")
            path = frames.frame_socket_path(settings.unix_socket)

            async def over_frames():
                channel = await FrameChannel.open(path, TOKEN, timeout_s=30)
                try:
                    held = asyncio.create_task(channel.call("Embed", embed_request([[8, 9]]), timeout=60))
                    while server.server.service.active_calls < 2:
                        await asyncio.sleep(0.005)
                    with pytest.raises(ReplicaCallError) as refused:
                        await channel.call("Embed", embed_request([[10, 11]]), timeout=30)
                    with pytest.raises(grpc.RpcError) as refused_grpc:
                        await asyncio.to_thread(server.stub.Embed, embed_request([[12]]), timeout=30,
                                                metadata=METADATA)
                    recorder.gate.set()
                    return refused.value, refused_grpc.value, await held
                finally:
                    channel.close()
            refused, refused_grpc, held = asyncio.run(over_frames())
            assert held.embeddings.shape == [1, 32]
            assert held_grpc.result(30).embeddings.shape == [1, 32]
    recorder.close()
    for error in (refused, refused_grpc):
        assert (error.code(), error.details()) == (grpc.StatusCode.RESOURCE_EXHAUSTED,
                                                   "the replica is serving its maximum of concurrent calls")
