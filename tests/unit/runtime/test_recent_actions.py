"""The runtime's memory of the actions it runs and ran: what answers a duplicate order when
Redis lost the action ledger (issue 12, part 2)."""

from __future__ import annotations

import asyncio

from services.runtime.recent_actions import RecentActions


async def test_a_run_under_way_then_its_result_then_forgotten_past_the_limit() -> None:
    recent = RecentActions(kept=2)
    assert recent.result("a") is None and recent.running("a") is None
    recent.begin("a")
    run = recent.running("a")
    assert run is not None and not run.done()
    recent.done("a", '{"x": 1}')
    assert await asyncio.wait_for(run, 1) == '{"x": 1}'
    assert recent.result("a") == '{"x": 1}' and recent.running("a") is None
    recent.done("b", "b")
    recent.done("c", "c")
    assert recent.result("a") is None and recent.result("c") == "c"


async def test_an_abandoned_run_lets_a_duplicate_try() -> None:
    recent = RecentActions()
    recent.begin("a")
    run = recent.running("a")
    recent.abandon("a")
    assert run is not None and run.cancelled()
    assert recent.running("a") is None and recent.result("a") is None
