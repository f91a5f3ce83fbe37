"""Who starts a sandbox next on this replica's engine.

The engine starts sandboxes at the same rate however many it is asked for at once (here about
5 a second from 2 at once to 16), and each start takes as much longer as there are others
beside it: 0.4 s two at a time, 2.8 s sixteen at a time. So starts go through a few slots
(`sandbox_start_concurrency`), handed out fairly between tenants (shared/fair_slots.py; an
interactive task before its tenant's batch ones), with the pool's own refills as one more
tenant. A tenant arriving during another's flood of starts waits for
the next free slot, not behind the whole flood, and its start is as quick as on an idle engine.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass

from shared.events import TaskPriority
from shared.fair_slots import FairSlots

__all__ = ["ANYONE", "REFILL", "StartGate", "StartTerms"]


@dataclass(frozen=True)
class StartTerms:
    """What a sandbox start goes by: whose it is (its slot among the starts), and how many
    warm sandboxes its task leaves in the pool (seating.py reads both from the task's seat)."""

    tenant: str
    priority: TaskPriority = TaskPriority.INTERACTIVE
    leave_idle: int = 0


# The pool's own starts, refilling its warm sandboxes: a tenant of their own among the starts.
REFILL = StartTerms(tenant="(warm pool)")
# A start nobody said anything about (a task without a seat record, a test): served as a tenant.
ANYONE = StartTerms(tenant="-")


class StartGate:
    def __init__(self, size: int) -> None:
        self._slots = FairSlots(size)

    @asynccontextmanager
    async def slot(self, terms: StartTerms) -> AsyncIterator[None]:
        async with self._slots.slot(terms.tenant, terms.priority):
            yield
