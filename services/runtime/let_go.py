"""The containers a pool let go of lately to remove them (their task lost them or ended).

Reconciliation works from a list of containers that may be older than a removal: a container
the pool let go of, still named for its task and no longer bound, must not look to it like one
whose binding Redis lost, to be bound again. It is remembered for longer than a reconciliation
pass takes.
"""

from __future__ import annotations

import time

__all__ = ["RecentlyLetGo"]

# Longer than a reconciliation pass takes, however slow the engine.
_LET_GO_REMEMBERED_S = 300.0


class RecentlyLetGo:
    def __init__(self) -> None:
        # Container id -> when it was let go of.
        self._since: dict[str, float] = {}

    def add(self, container_id: str) -> None:
        now = time.monotonic()
        self._since[container_id] = now
        for cid, since in list(self._since.items()):
            if now - since > _LET_GO_REMEMBERED_S:
                del self._since[cid]

    def __contains__(self, container_id: object) -> bool:
        return container_id in self._since
