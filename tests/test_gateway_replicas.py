"""The replica pool's choice (gateway/replicas.py) against real replicas.

Two ``embedserve scheduler`` processes (tiny random BERT) behind a real
gateway. Requests sent one at a time find every replica idle, so the
least-outstanding rule alone ties on every request; ties must be taken in
turn, or all traffic lands on the first replica while the others idle.
"""

from __future__ import annotations

from pathlib import Path

from gateway_harness import GatewayServer, SchedulerProcess, gateway_settings

CALLS = "embedserve_scheduler_calls_total"


def test_requests_sent_one_at_a_time_use_every_replica(tiny_bert_dir: Path, tiny_bert_replica) -> None:
    # The session's shared replica and one of our own: calls are counted as differences.
    own = SchedulerProcess(tiny_bert_dir, threads=1)
    replicas = [tiny_bert_replica, own]
    gateway = GatewayServer(gateway_settings(tiny_bert_dir, [r.address for r in replicas]))
    try:
        gateway.wait_ready(healthy=2)
        before = [r.metric(CALLS) for r in replicas]
        with gateway.client() as client:
            for i in range(8):
                reply = client.post("/v1/embeddings", json={"input": f"one at a time {i}"})
                assert reply.status_code == 200, reply.text
        served = [r.metric(CALLS) - b for r, b in zip(replicas, before)]
        assert sum(served) == 8
        # In turn: each idle replica gets every other request.
        assert served == [4, 4], served
    finally:
        gateway.stop()
        own.stop()
