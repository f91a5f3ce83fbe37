"""The inputs whose whole outbox this replica published, most recent ones only.

What a turn may leave out when it sends again the log entries of an outbox its State drops
(TaskState.outbox_leaving). An optimisation, never the truth: an input missing here (another
replica's, or one forgotten) has its entries sent once more, a no-op in JetStream.
"""

from __future__ import annotations

from collections import OrderedDict

__all__ = ["PublishedInputs"]


class PublishedInputs:
    def __init__(self, max_kept: int = 50_000) -> None:
        self.max_kept = max_kept
        self._ids: OrderedDict[str, None] = OrderedDict()

    def seen(self, input_id: str) -> None:
        self._ids[input_id] = None
        self._ids.move_to_end(input_id)
        while len(self._ids) > self.max_kept:
            self._ids.popitem(last=False)

    def __contains__(self, input_id: object) -> bool:
        return input_id in self._ids
