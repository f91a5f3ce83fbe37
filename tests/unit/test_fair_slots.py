"""FairSlots: a freed slot goes to the waiting tenant holding the fewest (by weight), an
interactive caller before its tenant's batch ones, arrival order after that; never more holders
than slots, and a cancelled waiter neither holds nor loses a slot."""

from __future__ import annotations

import asyncio

import pytest

from shared.events import TaskPriority
from shared.fair_slots import FairSlots

BATCH, INTERACTIVE = TaskPriority.BATCH, TaskPriority.INTERACTIVE


async def _served(
    slots: FairSlots, callers: list[tuple[str, TaskPriority]], hold_s: float = 0.005
) -> list[str]:
    """Every caller queued while a blocker holds every slot; the order they got one in."""
    order: list[str] = []
    release, all_held = asyncio.Event(), asyncio.Event()
    holding = 0

    async def blocker() -> None:
        nonlocal holding
        async with slots.slot("blocker"):
            holding += 1
            if holding == slots.size:
                all_held.set()
            await release.wait()

    async def caller(name: str, tenant: str, priority: TaskPriority) -> None:
        async with slots.slot(tenant, priority):
            order.append(name)
            await asyncio.sleep(hold_s)

    blockers = [asyncio.create_task(blocker()) for _ in range(slots.size)]
    await all_held.wait()
    tasks = []
    for i, (tenant, priority) in enumerate(callers):
        tasks.append(asyncio.create_task(caller(f"{tenant}{i}", tenant, priority)))
        await asyncio.sleep(0)  # arrival order
    release.set()
    await asyncio.wait_for(asyncio.gather(*blockers, *tasks), 10)
    return order


async def test_a_quiet_tenant_waits_for_one_slot_not_behind_a_flood() -> None:
    order = await _served(FairSlots(1), [("a", BATCH)] * 20 + [("b", INTERACTIVE)] * 2)
    # b's first call comes right after a's first, not after all 20 of them.
    assert [n[0] for n in order[:4]] == ["a", "b", "a", "b"], order


async def test_interactive_calls_go_ahead_of_the_tenants_batch() -> None:
    order = await _served(FairSlots(1), [("a", BATCH)] * 5 + [("a", INTERACTIVE)] * 2)
    assert order[:2] == ["a5", "a6"] and order[2:] == ["a0", "a1", "a2", "a3", "a4"], order


async def test_weights_share_the_slots() -> None:
    slots = FairSlots(4, weight=lambda tenant: 3.0 if tenant == "heavy" else 1.0)
    order = await _served(slots, [("light", BATCH)] * 40 + [("heavy", BATCH)] * 40, hold_s=0.01)
    heavy = sum(1 for name in order[:40] if name.startswith("heavy"))
    assert 27 <= heavy <= 33, order  # about three in four while both wait


async def test_never_more_holders_than_slots() -> None:
    slots = FairSlots(3)
    inside = most = 0

    async def call(tenant: str) -> None:
        nonlocal inside, most
        async with slots.slot(tenant):
            inside += 1
            most = max(most, inside)
            await asyncio.sleep(0.001)
            inside -= 1

    await asyncio.gather(*(call(f"t{i % 4}") for i in range(100)))
    assert most == 3 and slots.free == 3


async def test_a_cancelled_waiter_neither_holds_nor_loses_a_slot() -> None:
    slots = FairSlots(1)
    release = asyncio.Event()

    async def hold() -> None:
        async with slots.slot("a"):
            await release.wait()

    holder = asyncio.create_task(hold())
    await asyncio.sleep(0)
    waiter = asyncio.create_task(hold())
    await asyncio.sleep(0)
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    release.set()
    await holder
    assert slots.free == 1 and slots.held_by("a") == 0
    async with asyncio.timeout(1):
        async with slots.slot("b"):
            assert slots.free == 0


def test_no_slots_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="at least one slot"):
        FairSlots(0)
