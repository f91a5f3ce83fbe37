"""The actions this replica runs or ran lately, in memory: what a Redis loss cannot take.

The action ledger (bindings.ActionLedger) lives in Redis, so that any replica sees what any
other ran. A FLUSHALL (or a new, empty Redis) takes it: a duplicate ExecuteAction coming while
the action still runs would find no claim and run it a second time, and one coming after it
ran would find no recorded observation. For the orders that reach the replica that ran the
action (every order, with one runtime replica) this memory answers instead: a duplicate waits
for the run under way, or gets the observation it produced. Orders whose observation the
controller already applied are refused before (order_check: the rebuilt State no longer awaits
them: the log says they ran).
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict

__all__ = ["RecentActions"]


class RecentActions:
    def __init__(self, kept: int = 4096) -> None:
        self.kept = kept
        self._results: OrderedDict[str, str] = OrderedDict()
        self._running: dict[str, asyncio.Future[str]] = {}

    def result(self, action_id: str) -> str | None:
        """The observation (JSON) this replica published for the action, if it still knows."""
        return self._results.get(action_id)

    def running(self, action_id: str) -> asyncio.Future[str] | None:
        """The run of the action under way here, resolved with its observation."""
        return self._running.get(action_id)

    def begin(self, action_id: str) -> None:
        self._running.setdefault(action_id, asyncio.get_running_loop().create_future())

    def done(self, action_id: str, observation_json: str) -> None:
        self._results[action_id] = observation_json
        self._results.move_to_end(action_id)
        while len(self._results) > self.kept:
            self._results.popitem(last=False)
        run = self._running.pop(action_id, None)
        if run is not None and not run.done():
            run.set_result(observation_json)

    def abandon(self, action_id: str) -> None:
        """The run failed before it produced an observation: a duplicate may try again."""
        run = self._running.pop(action_id, None)
        if run is not None and not run.done():
            run.cancel()
