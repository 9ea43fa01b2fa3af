"""The drain gate on a real server: admitted requests finish, new ones get a clean 503.

A small Starlette app behind ``DrainMiddleware`` under uvicorn on
127.0.0.1:0; its one work route waits until the test releases it, so "a
request admitted before the drain is still running" holds by construction.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
import time
from collections.abc import Iterator

import httpx
import pytest
import uvicorn
from prometheus_client import CollectorRegistry
from starlette.applications import Starlette
from starlette.responses import JSONResponse
from starlette.routing import Route

from embedserve.gateway.cli import listening_socket
from embedserve.gateway.draining import Drain, DrainMiddleware


class HeldApp:
    """A server whose /work requests wait for ``release()``; runs on its own thread."""

    def __init__(self) -> None:
        self.drain = Drain(CollectorRegistry(), retry_after_s=2)
        self.entered = threading.Semaphore(0)
        self._gate: asyncio.Event | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

        async def work(request):  # noqa: ANN001, ANN202
            self._loop = asyncio.get_running_loop()
            self._gate = self._gate or asyncio.Event()
            self.entered.release()
            await self._gate.wait()
            return JSONResponse({"done": True})

        async def ready(request):  # noqa: ANN001, ANN202
            return JSONResponse({"status": "ready"})

        async def health(request):  # noqa: ANN001, ANN202
            return JSONResponse({"status": "ok"})

        app = Starlette(routes=[Route("/work", work, methods=["POST"]), Route("/ready", ready),
                                Route("/health", health)])
        sock = listening_socket("127.0.0.1", 0)
        self.url = f"http://127.0.0.1:{sock.getsockname()[1]}"
        self.server = uvicorn.Server(uvicorn.Config(DrainMiddleware(app, self.drain),
                                                    log_level="warning"))
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [sock]},
                                       daemon=True)
        self.thread.start()
        while not self.server.started:
            assert self.thread.is_alive(), "the server failed to start"
            time.sleep(0.01)

    def on_loop(self, callback) -> None:  # noqa: ANN001
        """Run ``callback`` on the server's loop (known once a request has arrived)."""
        assert self._loop is not None
        self._loop.call_soon_threadsafe(callback)

    def release(self) -> None:
        assert self._gate is not None
        self.on_loop(self._gate.set)

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(10)


@pytest.fixture
def held() -> Iterator[HeldApp]:
    server = HeldApp()
    try:
        yield server
    finally:
        if server._gate is not None:
            server.release()
        server.stop()


def test_admitted_request_finishes_while_new_ones_get_503(held: HeldApp) -> None:
    with concurrent.futures.ThreadPoolExecutor(1) as pool, \
            httpx.Client(base_url=held.url, timeout=30, trust_env=False) as http:
        before = http.get("/ready")
        assert before.status_code == 200 and before.headers.get("connection") != "close"
        admitted = pool.submit(httpx.post, f"{held.url}/work", timeout=30, trust_env=False)
        assert held.entered.acquire(timeout=30), "the request never reached the app"
        held.on_loop(held.drain.begin)
        while not held.drain.draining:
            time.sleep(0.01)

        refused = http.post("/work")
        assert refused.status_code == 503
        assert refused.json() == {"error": {"message": "the server is shutting down; retry the request",
                                            "type": "service_unavailable", "param": None,
                                            "code": "draining"}}
        assert refused.headers["retry-after"] == "2"
        assert refused.headers["connection"] == "close"
        assert http.get("/ready").status_code == 503      # load balancers stop sending at once
        assert http.get("/health").status_code == 200     # the process is alive

        assert held.drain.in_flight == 1
        held.release()
        answer = admitted.result(timeout=30)
        assert answer.status_code == 200 and answer.json() == {"done": True}
        # Answered while draining: the client's next request must not reuse this
        # connection, which the server closes once it is idle.
        assert answer.headers["connection"] == "close"
        assert held.drain.in_flight == 0


def test_wait_idle_reports_a_request_still_running() -> None:
    async def scenario() -> tuple[bool, bool]:
        drain = Drain(CollectorRegistry(), retry_after_s=1)
        with drain.admitted_request():
            drain.begin()
            still_running = await drain.wait_idle(0.01)
        return still_running, await drain.wait_idle(0.01)

    assert asyncio.run(scenario()) == (False, True)
