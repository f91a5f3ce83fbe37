"""shared.waiting.wait_up_to: a deadline that never swallows a cancellation."""

from __future__ import annotations

import asyncio

import pytest

from shared.waiting import wait_up_to


async def test_true_when_done_false_on_the_deadline() -> None:
    done = asyncio.Event()
    asyncio.get_running_loop().call_later(0.01, done.set)
    assert await wait_up_to(1.0, done.wait()) is True
    assert await wait_up_to(0.01, asyncio.Event().wait()) is False


async def test_a_pending_cancellation_ends_the_loop_at_the_next_deadline() -> None:
    """A cancellation that some awaited call swallowed stays pending on the task. Under it,
    asyncio.timeout reports its own expiry as TimeoutError (it cannot tell the two apart), so a
    loop that suppresses timeouts would run for ever; wait_up_to raises the cancellation."""
    rounds = 0

    async def swallowing_call() -> None:
        try:
            await asyncio.sleep(10)
        except asyncio.CancelledError:
            pass  # what a careless library does

    async def upkeep() -> None:
        nonlocal rounds
        await swallowing_call()
        while True:
            rounds += 1
            await wait_up_to(0.01, asyncio.Event().wait())

    task = asyncio.create_task(upkeep())
    await asyncio.sleep(0.01)
    task.cancel()  # swallowed inside the call; the task runs on, still "cancelling"
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(task, 2.0)
    assert rounds == 1  # ended at its first deadline
