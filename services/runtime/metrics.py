"""The runtime's Prometheus metrics (served on /metrics when DECKHANDS_METRICS_PORT is set)."""

from __future__ import annotations

from collections.abc import Iterable

from prometheus_client import Counter, Gauge, Histogram

from shared.admission import Seating

__all__ = [
    "ACQUIRE_SECONDS",
    "ACQUISITIONS",
    "ACTIONS",
    "ACTION_SECONDS",
    "CHECKPOINTS",
    "CHECKPOINT_BYTES",
    "CHECKPOINT_SECONDS",
    "COLD_START_SECONDS",
    "ORDERS_RELAYED",
    "POOL_HITS",
    "POOL_MISSES",
    "POOL_TARGET_IDLE",
    "PREPARED",
    "REFUSED",
    "RESTORES",
    "SANDBOXES",
    "SANDBOXES_IDLE_STOPPED",
    "SANDBOXES_LOST",
    "SANDBOXES_REMOVED",
    "SANDBOXES_RESTARTED",
    "SEATS",
    "SEAT_WAIT_SECONDS",
    "TENANT_SEATS",
]

_FAST = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)

SANDBOXES = Gauge("deckhands_runtime_sandboxes", "Sandboxes of this replica by state", ["state"])
POOL_TARGET_IDLE = Gauge(
    "deckhands_runtime_pool_target_idle", "Idle sandboxes the pool currently aims to keep"
)
ACQUISITIONS = Counter("deckhands_runtime_pool_acquisitions_total", "Sandboxes handed to tasks")
POOL_HITS = Counter(
    "deckhands_runtime_pool_hits_total", "Acquisitions served by a warm idle sandbox"
)
POOL_MISSES = Counter(
    "deckhands_runtime_pool_misses_total", "Acquisitions that had to start a sandbox"
)
ACQUIRE_SECONDS = Histogram(
    "deckhands_runtime_pool_acquire_seconds",
    "Time to hand a task a ready sandbox",
    buckets=_FAST,
)
COLD_START_SECONDS = Histogram(
    "deckhands_runtime_sandbox_cold_start_seconds",
    "From container create to the executor's first answer",
    buckets=_FAST,
)
SANDBOXES_LOST = Counter(
    "deckhands_runtime_sandboxes_lost_total", "Sandboxes found dead", ["where"]
)
SANDBOXES_REMOVED = Counter(
    "deckhands_runtime_sandboxes_removed_total", "Sandbox containers removed", ["reason"]
)
SANDBOXES_IDLE_STOPPED = Counter(
    "deckhands_runtime_sandboxes_idle_stopped_total",
    "Task sandboxes stopped while their task waited for the user",
)
SANDBOXES_RESTARTED = Counter(
    "deckhands_runtime_sandboxes_restarted_total",
    "Stopped task sandboxes started again for their task's next action",
)
ACTIONS = Counter("deckhands_runtime_actions_total", "Actions executed", ["kind", "outcome"])
CHECKPOINTS = Counter(
    "deckhands_runtime_checkpoints_total",
    "Workspace checkpoints after actions, checkouts and uploads: taken, or why not "
    "(too_large, quota, store_full, failed, not_running); an action that changed nothing "
    "takes none",
    ["outcome"],
)
CHECKPOINT_BYTES = Counter(
    "deckhands_runtime_checkpoint_stored_bytes_total", "Bytes checkpoints added to the store"
)
RESTORES = Counter(
    "deckhands_runtime_workspace_restores_total",
    "Sandboxes bound afresh to a task whose files came back from its last checkpoint",
)
CHECKPOINT_SECONDS = Histogram(
    "deckhands_runtime_checkpoint_seconds",
    "From an action's observation to its checkpoint stored (while the agent thinks)",
    buckets=_FAST,
)
ACTION_SECONDS = Histogram(
    "deckhands_runtime_action_seconds",
    "Action round trip inside the runtime",
    ["kind"],
    buckets=_FAST,
)
# Every kind's series exists from the start: a rate needs a sample from before the first action.
for _kind in ("run", "run_python", "read", "write", "edit"):
    ACTION_SECONDS.labels(_kind)
SEATS = Gauge(
    "deckhands_runtime_seats",
    "Tasks holding a sandbox seat (taken; of them, those whose sandbox is still starting) and "
    "tasks waiting for one (queued), whole pool",
    ["state"],
)
TENANT_SEATS = Gauge(
    "deckhands_runtime_tenant_seats",
    "Per tenant: tasks holding a sandbox seat (taken) and tasks waiting for one (queued)",
    ["tenant", "state"],
)
SEAT_WAIT_SECONDS = Histogram(
    "deckhands_runtime_seat_wait_seconds",
    "Per tenant: how long a task waited for its sandbox seat (0 when one was free)",
    ["tenant"],
    buckets=(0.1, 0.5, 1, 2.5, 5, 10, 20, 30, 60, 120, 300, 600, 1800),
)
_TENANTS_SHOWN: set[str] = set()


def observe_seatings(seatings: Iterable[Seating]) -> None:
    for seating in seatings:
        SEAT_WAIT_SECONDS.labels(seating.tenant_id).observe(seating.waited_s)


def publish_seat_gauges(
    taken: int, queued: int, tenants: dict[str, tuple[int, int]], starting: int | None = None
) -> None:
    """The pool's seats, whole and per tenant (a tenant gone from both counts shows 0)."""
    SEATS.labels("taken").set(taken)
    SEATS.labels("queued").set(queued)
    if starting is not None:
        SEATS.labels("starting").set(starting)
    for tenant in _TENANTS_SHOWN - set(tenants):
        TENANT_SEATS.labels(tenant, "taken").set(0)
        TENANT_SEATS.labels(tenant, "queued").set(0)
    for tenant, (held, waiting) in tenants.items():
        TENANT_SEATS.labels(tenant, "taken").set(held)
        TENANT_SEATS.labels(tenant, "queued").set(waiting)
    _TENANTS_SHOWN.update(tenants)


PREPARED = Counter(
    "deckhands_runtime_sandboxes_prepared_total",
    "Task sandboxes bound ahead of the task's first action (while the agent thinks)",
)
ORDERS_RELAYED = Counter(
    "deckhands_runtime_orders_relayed_total",
    "Orders a replica did not run itself: passed on to the replica holding the task's sandbox, "
    "or handed back to every replica from the queue of a replica that is gone",
    ["how"],
)
# Orders refused before they reach a sandbox (order_check.py).
REFUSED = Counter(
    "deckhands_runtime_orders_refused_total",
    "ExecuteActions the runtime refused to run: not the reviewed action the task awaits",
    ["why"],
)
