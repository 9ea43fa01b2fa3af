"""``cancel_on_disconnect``: the work runs in the request's own task, and only the
client's leaving becomes ``Cancelled``.

The request is an ASGI receive channel fed by the test (what uvicorn hands a
route once the body is read: the next message is ``http.disconnect``); the
end-to-end case, a real client leaving mid-request, is in test_gateway_e2e.py.
"""

from __future__ import annotations

import asyncio

import pytest

from embedserve.errors import Cancelled
from embedserve.gateway.pipeline import cancel_on_disconnect


class ReceiveChannel:
    """Stands in for a Starlette Request: ``receive()`` waits for what the test sends."""

    def __init__(self) -> None:
        self.messages: asyncio.Queue[dict] = asyncio.Queue()

    async def receive(self) -> dict:
        return await self.messages.get()


def test_the_work_runs_in_the_calling_task_and_its_answer_comes_back():
    async def main():
        request = ReceiveChannel()
        caller = asyncio.current_task()

        async def work():
            assert asyncio.current_task() is caller
            await asyncio.sleep(0.01)
            return 42

        assert await cancel_on_disconnect(request, work()) == 42
        # A disconnect after the answer cancels nothing: this task goes on awaiting.
        request.messages.put_nowait({"type": "http.disconnect"})
        await asyncio.sleep(0.01)
        assert caller.cancelling() == 0
        return "still running"

    assert asyncio.run(main()) == "still running"


def test_a_client_that_leaves_cancels_the_work_as_cancelled():
    async def main():
        request = ReceiveChannel()
        stopped = asyncio.Event()

        async def work():
            try:
                await asyncio.sleep(30)
            finally:
                stopped.set()

        asyncio.get_running_loop().call_later(0.01, request.messages.put_nowait,
                                              {"type": "http.disconnect"})
        with pytest.raises(Cancelled):
            await cancel_on_disconnect(request, work())
        assert stopped.is_set()
        assert asyncio.current_task().cancelling() == 0
        await asyncio.sleep(0)  # no cancellation left pending on this task

    asyncio.run(main())


def test_other_messages_are_not_a_disconnect():
    async def main():
        request = ReceiveChannel()
        request.messages.put_nowait({"type": "http.request", "body": b"", "more_body": False})

        async def work():
            await asyncio.sleep(0.02)
            return "done"

        assert await cancel_on_disconnect(request, work()) == "done"

    asyncio.run(main())


def test_someone_elses_cancellation_stays_a_cancellation():
    async def main():
        request = ReceiveChannel()

        async def handler():
            async def work():
                await asyncio.sleep(30)
            return await cancel_on_disconnect(request, work())

        task = asyncio.ensure_future(handler())
        await asyncio.sleep(0.01)
        task.cancel()   # shutdown, or a deadline above the route
        with pytest.raises(asyncio.CancelledError):
            await task

        # Both at once: the client leaves and the task is cancelled from outside.
        task = asyncio.ensure_future(handler())
        await asyncio.sleep(0.01)
        request.messages.put_nowait({"type": "http.disconnect"})
        await asyncio.sleep(0)   # the watcher runs and cancels the handler's task
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())
