"""Every NATS subject and JetStream stream name, in one place.

Layout:
  deckhands.events.<task>            the task's event log (stream EVENTS, source of truth)
  deckhands.work.<service>.<task>    work orders to one service (stream WORK, work queue)
  deckhands.routed.<service>.<replica>.<task>
                                     work orders to one replica of a service: the runtime
                                     replica whose engine holds the task's sandbox (stream
                                     ROUTED, work queue; a consumer per replica)
  deckhands.dlq.<service>            messages a service gave up on (stream DLQ)
  deckhands.storage.history          request/reply, core NATS
  deckhands.storage.forget           request/reply, core NATS, every storage replica
  deckhands.deletions.<task>         a deleted task, for every storage replica (stream DELETIONS)
  deckhands.notices.<task>           a task's state changes, copied from its log by the
                                     controller for webhooks (stream NOTICES, work queue)
  object store BLOBS_BUCKET          large content an event refers to (claim checks)
  object store CHECKPOINTS_BUCKET    tasks' workspace checkpoints (the runtime's, issue 28)
  key-value TENANTS_BUCKET           tenants, API key hashes and limits (the gateway's)
  key-value SECRETS_BUCKET           tenants' secrets, sealed, and tasks' grants (the gateway's)
"""

from __future__ import annotations

import re
from enum import StrEnum

__all__ = [
    "BLOBS_BUCKET",
    "CHECKPOINTS_BUCKET",
    "DELETIONS_STREAM",
    "DLQ_STREAM",
    "EVENTS_STREAM",
    "FORGET_SUBJECT",
    "HISTORY_SUBJECT",
    "NOTICES_STREAM",
    "ROUTED_STREAM",
    "SECRETS_BUCKET",
    "TENANTS_BUCKET",
    "WORK_STREAM",
    "Service",
    "deletion_subject",
    "dlq_subject",
    "event_subject",
    "notice_subject",
    "replica_of_routed",
    "replica_token",
    "routed_subject",
    "work_subject",
]

EVENTS_STREAM = "DECKHANDS_EVENTS"
WORK_STREAM = "DECKHANDS_WORK"
DLQ_STREAM = "DECKHANDS_DLQ"
DELETIONS_STREAM = "DECKHANDS_DELETIONS"
NOTICES_STREAM = "DECKHANDS_NOTICES"
ROUTED_STREAM = "DECKHANDS_ROUTED"
BLOBS_BUCKET = "deckhands-blobs"
CHECKPOINTS_BUCKET = "deckhands-checkpoints"
TENANTS_BUCKET = "deckhands-tenants"
SECRETS_BUCKET = "deckhands-secrets"

HISTORY_SUBJECT = "deckhands.storage.history"
FORGET_SUBJECT = "deckhands.storage.forget"


class Service(StrEnum):
    GATEWAY = "gateway"
    CONTROLLER = "controller"
    REASONER = "reasoner"
    SECURITY = "security"
    RUNTIME = "runtime"
    STORAGE = "storage"


def _token(task_id: str) -> str:
    # A task id becomes one subject token: dots or wildcards would change the routing.
    if not task_id or any(c in task_id for c in ".*> \t\r\n"):
        raise ValueError(f"task id {task_id!r} cannot be a NATS subject token")
    return task_id


def event_subject(task_id: str = "*") -> str:
    return f"deckhands.events.{task_id if task_id in ('*', '>') else _token(task_id)}"


def work_subject(service: Service, task_id: str = "*") -> str:
    tok = task_id if task_id in ("*", ">") else _token(task_id)
    return f"deckhands.work.{service.value}.{tok}"


def replica_token(name: str) -> str:
    """A replica's name as one subject token and a consumer name: what Kubernetes names a node
    or a pod (DNS names, with dots) is kept, every other character becoming `_`."""
    token = re.sub(r"[^A-Za-z0-9_-]", "_", name.strip())[:64]
    if not token:
        raise ValueError(f"replica name {name!r} is empty")
    return token


def routed_subject(service: Service, replica: str = "*", task_id: str = "*") -> str:
    """Orders for one replica of a service (the runtime: the one holding the task's sandbox)."""
    rep = replica if replica == "*" else replica_token(replica)
    if rep != replica:
        raise ValueError(f"replica name {replica!r} is not a subject token")
    tok = task_id if task_id in ("*", ">") else _token(task_id)
    return f"deckhands.routed.{service.value}.{rep}.{tok}"


def replica_of_routed(subject: str) -> str:
    """The replica a routed subject names (`deckhands.routed.<service>.<replica>.<task>`)."""
    parts = subject.split(".")
    if len(parts) != 5 or parts[:2] != ["deckhands", "routed"]:
        raise ValueError(f"{subject!r} is not a routed subject")
    return parts[3]


def dlq_subject(service: Service | str) -> str:
    return f"deckhands.dlq.{Service(service).value}"


def deletion_subject(task_id: str) -> str:
    """Where a deleted task is announced, so that every storage replica, one that is down
    included once it is back, removes its copy of the task's events."""
    return f"deckhands.deletions.{task_id}"


def notice_subject(task_id: str = "*") -> str:
    """A task's state changes (AgentStateChangedObservation, as logged), for the gateway's
    webhooks: a copy apart from the log, so that webhooks read a few messages per task rather
    than every event of every task."""
    return f"deckhands.notices.{task_id if task_id in ('*', '>') else _token(task_id)}"
