"""Who may publish and subscribe to what on NATS: one user per service, and an admin.

Each service gets exactly the subjects its code uses (shared/subjects.py, each service's
main.py and handlers), and the JetStream API subjects of its own durable consumer. Replies come
to an inbox prefix of its own (`_INBOX_<user>`, set on the connection), so no service can read
another's replies (pull fetches and JetStream acknowledgements travel there). Only the admin may
create, update or delete streams (tools.streams), and only the controller may send work orders
to the reasoner and the runtime: a forged ExecuteAction from any other credentials is refused
by the server. The security monitor takes reviews from the controller and from the reasoner,
which sends each runnable action there on its way to the controller (shared/events/reviewed.py):
a reasoner could already send the controller any action, and the controller still orders the
run only on the monitor's ALLOW.

The one exception to "orders come from the controller" is the runtime's own queue: a task that
waited for a sandbox seat has its ExecuteAction re-sent by the runtime to itself once a seat
frees (services/runtime/main.py, `resend`). The runtime may therefore publish to
`deckhands.work.runtime.*`, which only it consumes; it can run any order it holds anyway.
For the same reason it may publish to `deckhands.routed.runtime.*.*`: an order that reached a
replica whose engine does not hold the task's sandbox is passed on to the replica that does, and
the orders queued for a replica that is gone are passed back to the shared subject.

Orders routed to one runtime replica live in their own stream (ROUTED), with one durable
consumer per replica (`runtime_<replica>`): the runtime may use any consumer of that stream (a
replica that is gone has its queue drained by another), and no consumer of WORK but its own.

`nats_authorization` renders this as a nats-server `authorization` block, used by `make up`
(passwords written in) and by the Kubernetes ConfigMap (passwords as `$NATS_PASSWORD_<USER>`
environment references, from the Secret `deckhands-nats-users`).
"""

from __future__ import annotations

import json
from collections.abc import Callable

from .redis_records import key_permissions, read_patterns, written_patterns
from .subjects import (
    BLOBS_BUCKET,
    CHECKPOINTS_BUCKET,
    DELETIONS_STREAM,
    DLQ_STREAM,
    EVENTS_STREAM,
    NOTICES_STREAM,
    ROUTED_STREAM,
    SECRETS_BUCKET,
    TENANTS_BUCKET,
    WORK_STREAM,
    Service,
)

# shared.workspace imports more than this module may (Redis, NATS): the subject is repeated.
_WORKSPACE = "deckhands.runtime.workspace"

__all__ = [
    "ADMIN_USER",
    "EGRESS_USER",
    "NATS_USERS",
    "REDIS_USERS",
    "Permissions",
    "inbox_prefix",
    "nats_authorization",
    "nats_permissions",
    "redis_acl",
    "redis_rules",
]

ADMIN_USER = "admin"
# The egress proxy (services/egress) is no broker service: it only sends each task's
# connections to the controller, which logs them.
EGRESS_USER = "egress"
NATS_USERS = (*(s.value for s in Service), EGRESS_USER, ADMIN_USER)
# Services that use Redis (security and storage do not); each its own ACL user. The egress
# proxy's reads only the records it is a reader of (tenants' secrets, which a task may use,
# tenants' egress allowances) and writes its own (egress bytes per day); no other key.
REDIS_USERS = ("gateway", "controller", "reasoner", "runtime", EGRESS_USER, ADMIN_USER)

Permissions = dict[str, list[str]]  # "publish" / "subscribe" -> allowed subjects

_OBJECTS = f"OBJ_{BLOBS_BUCKET}"
_CHECKPOINTS = f"OBJ_{CHECKPOINTS_BUCKET}"
_TENANTS = f"KV_{TENANTS_BUCKET}"
_SECRETS = f"KV_{SECRETS_BUCKET}"
_DECLARED = (
    EVENTS_STREAM,
    WORK_STREAM,
    ROUTED_STREAM,
    DLQ_STREAM,
    DELETIONS_STREAM,
    NOTICES_STREAM,
    _OBJECTS,
    _CHECKPOINTS,
    _TENANTS,
    _SECRETS,
)


def inbox_prefix(user: str) -> str:
    """The reply subjects of a user's connection: `_INBOX_<user>.<random>`."""
    return f"_INBOX_{user}"


def _consumer(stream: str, durable: str) -> list[str]:
    """Bind, fetch from, acknowledge and watch one durable pull consumer."""
    return [
        f"$JS.API.CONSUMER.CREATE.{stream}.{durable}",
        f"$JS.API.CONSUMER.CREATE.{stream}.{durable}.>",
        f"$JS.API.CONSUMER.DURABLE.CREATE.{stream}.{durable}",
        f"$JS.API.CONSUMER.INFO.{stream}.{durable}",
        f"$JS.API.CONSUMER.MSG.NEXT.{stream}.{durable}",
        f"$JS.ACK.{stream}.{durable}.>",
    ]


def _blob_reader(bucket: str = BLOBS_BUCKET) -> list[str]:
    objects = f"OBJ_{bucket}"
    return [
        # nats-py finds the object store's stream by its chunks' subject before reading them.
        "$JS.API.STREAM.NAMES",
        f"$JS.API.STREAM.MSG.GET.{objects}",
        f"$JS.API.DIRECT.GET.{objects}",
        f"$JS.API.DIRECT.GET.{objects}.>",
        # Reading an object's chunks (or listing the objects): an ordered consumer of one's
        # own, removed after.
        f"$JS.API.CONSUMER.CREATE.{objects}",
        f"$JS.API.CONSUMER.CREATE.{objects}.>",
        f"$JS.API.CONSUMER.DELETE.{objects}.>",
        f"$JS.FC.{objects}.>",
    ]


def _blob_writer(bucket: str = BLOBS_BUCKET) -> list[str]:
    # Putting an object (chunks, then its metadata), or deleting one (a marker, chunks purged).
    return [*_blob_reader(bucket), f"$O.{bucket}.>", f"$JS.API.STREAM.PURGE.OBJ_{bucket}"]


def _tenant_records() -> list[str]:
    """The gateway's tenants bucket: read a record, write one, list them (a pull consumer
    of one's own, removed after)."""
    return [
        f"$KV.{TENANTS_BUCKET}.>",
        f"$JS.API.STREAM.MSG.GET.{_TENANTS}",
        f"$JS.API.DIRECT.GET.{_TENANTS}",
        f"$JS.API.DIRECT.GET.{_TENANTS}.>",
        f"$JS.API.CONSUMER.CREATE.{_TENANTS}",
        f"$JS.API.CONSUMER.CREATE.{_TENANTS}.>",
        f"$JS.API.CONSUMER.INFO.{_TENANTS}.>",
        f"$JS.API.CONSUMER.MSG.NEXT.{_TENANTS}.>",
        f"$JS.API.CONSUMER.DELETE.{_TENANTS}.>",
    ]


def _secret_records() -> list[str]:
    """The gateway's secrets bucket: write a record, delete one, list and read them all to
    fill a Redis that lost its data (a pull consumer of its own, removed after)."""
    return [
        f"$KV.{SECRETS_BUCKET}.>",
        f"$JS.API.STREAM.MSG.GET.{_SECRETS}",
        f"$JS.API.DIRECT.GET.{_SECRETS}",
        f"$JS.API.DIRECT.GET.{_SECRETS}.>",
        f"$JS.API.CONSUMER.CREATE.{_SECRETS}",
        f"$JS.API.CONSUMER.CREATE.{_SECRETS}.>",
        f"$JS.API.CONSUMER.INFO.{_SECRETS}.>",
        f"$JS.API.CONSUMER.MSG.NEXT.{_SECRETS}.>",
        f"$JS.API.CONSUMER.DELETE.{_SECRETS}.>",
    ]


def _service(user: str, publish: list[str], subscribe: list[str]) -> Permissions:
    common = [
        "$JS.API.INFO",
        # ensure_streams at start-up checks each stream is as declared.
        *(f"$JS.API.STREAM.INFO.{stream}" for stream in _DECLARED),
        f"deckhands.dlq.{user}",
    ]
    return {
        "publish": [*common, *publish],
        "subscribe": [f"{inbox_prefix(user)}.>", *subscribe],
    }


_CONTROLLER_INBOX = "deckhands.work.controller.*"

_SERVICES: dict[str, Callable[[], Permissions]] = {
    Service.CONTROLLER.value: lambda: _service(
        "controller",
        [
            *_consumer(WORK_STREAM, "controller"),
            *_consumer(DELETIONS_STREAM, "controller"),  # a deleted task's State goes
            "deckhands.events.*",
            "deckhands.notices.*",  # each state change again, for webhooks
            # A task's log read back, entry by entry, to rebuild a State Redis lost.
            f"$JS.API.STREAM.MSG.GET.{EVENTS_STREAM}",
            "deckhands.work.controller.*",
            "deckhands.work.reasoner.*",
            "deckhands.work.security.*",
            "deckhands.work.runtime.*",
            "deckhands.routed.runtime.*.*",  # to the replica holding the task's sandbox
        ],
        [],
    ),
    Service.REASONER.value: lambda: _service(
        "reasoner",
        [
            *_consumer(WORK_STREAM, "reasoner"),
            _CONTROLLER_INBOX,
            "deckhands.work.security.*",  # a runnable action goes by way of the monitor
            "deckhands.storage.history",
            *_blob_writer(),  # a large argument (a file to write) goes out as a claim check
        ],
        [],
    ),
    Service.SECURITY.value: lambda: _service(
        "security", [*_consumer(WORK_STREAM, "security"), _CONTROLLER_INBOX], []
    ),
    Service.RUNTIME.value: lambda: _service(
        "runtime",
        [
            *_consumer(WORK_STREAM, "runtime"),
            *_consumer(DELETIONS_STREAM, "runtime"),  # a deleted task's workspace records go
            # Its own replica's queue, and that of a replica that is gone (drained).
            *_consumer(ROUTED_STREAM, "*"),
            _CONTROLLER_INBOX,
            "deckhands.work.runtime.*",  # a queued order re-sent to itself (module docstring)
            "deckhands.routed.runtime.*.*",  # passed on to the replica holding the sandbox
            # ... and a workspace request likewise.
            f"{_WORKSPACE}.*",
            *_blob_writer(),
            *_blob_writer(CHECKPOINTS_BUCKET),  # tasks' workspace checkpoints: its alone
        ],
        # A task's workspace in and out (request/reply), sent to any replica or to this one.
        [_WORKSPACE, f"{_WORKSPACE}.*"],
    ),
    Service.STORAGE.value: lambda: _service(
        "storage",
        # One durable consumer per replica (storage-0, storage-1, ...), of the log and of the
        # deleted tasks.
        [*_consumer(EVENTS_STREAM, "*"), *_consumer(DELETIONS_STREAM, "*")],
        ["deckhands.storage.history", "deckhands.storage.forget"],
    ),
    Service.GATEWAY.value: lambda: _service(
        "gateway",
        [
            _CONTROLLER_INBOX,
            "deckhands.storage.history",
            "deckhands.storage.forget",
            _WORKSPACE,
            # DELETE /v1/tasks/{id} purges the task's subject from the log.
            f"$JS.API.STREAM.PURGE.{EVENTS_STREAM}",
            "deckhands.deletions.*",  # ... and tells every storage replica, down ones included
            # Webhooks: one durable consumer of the tasks' state changes shared by the
            # replicas (issue 11).
            *_consumer(NOTICES_STREAM, "webhooks"),
            *_blob_writer(),
            # Whether a fork's checkpoint is still kept (its metadata, one message get).
            f"$JS.API.STREAM.MSG.GET.{_CHECKPOINTS}",
            *_tenant_records(),  # tenants and API keys, durable (Redis caches them)
            *_secret_records(),  # tenants' secrets, sealed, durable (readers read Redis)
        ],
        ["deckhands.events.*"],  # live events for the SSE stream
    ),
}


def nats_permissions(user: str) -> Permissions:
    """What `user` (a service's name, EGRESS_USER or ADMIN_USER) may publish and subscribe to."""
    if user == ADMIN_USER:
        return {"publish": [">"], "subscribe": [">"]}
    if user == EGRESS_USER:
        return {"publish": [_CONTROLLER_INBOX], "subscribe": [f"{inbox_prefix(user)}.>"]}
    return _SERVICES[user]()


def nats_authorization(password: Callable[[str], str]) -> str:
    """A nats-server `authorization` block for NATS_USERS; `password(user)` is written as it
    is (a quoted literal, or a `$VARIABLE` reference)."""
    lines = ["authorization {", "  users: ["]
    for user in NATS_USERS:
        permissions = nats_permissions(user)
        lines.append(f"    {{user: {user}, password: {password(user)}, permissions: {{")
        lines.append(f"      publish: {{allow: {json.dumps(permissions['publish'])}}}")
        lines.append(f"      subscribe: {{allow: {json.dumps(permissions['subscribe'])}}}")
        if user == Service.STORAGE.value:
            lines.append("      allow_responses: true  # answers history and forget requests")
        if user == Service.RUNTIME.value:
            lines.append("      allow_responses: true  # answers workspace requests")
        lines.append("    }}")
    lines += ["  ]", "}"]
    return "\n".join(lines) + "\n"


def redis_rules(user: str) -> list[str]:
    """`user`'s Redis ACL rules but its name, state and password: the admin may do everything;
    a service reads every key, writes only the records it is the writer of (shared/redis_records.py:
    Redis refuses any other write, NOPERM), and runs none of the dangerous commands (FLUSHALL,
    CONFIG, KEYS, DEBUG, ACL, SHUTDOWN...)."""
    if user == ADMIN_USER:
        return ["~*", "&*", "+@all"]
    if user == EGRESS_USER:
        return [
            *(f"%R~{pattern}" for pattern in read_patterns(user)),
            *(f"%RW~{pattern}" for pattern in written_patterns(user)),
            "+@read",
            "+@write",
            "+@connection",
            "-@dangerous",
        ]
    return [*key_permissions(user), "&*", "+@all", "-@dangerous"]


def redis_acl(password: Callable[[str], str]) -> list[str]:
    """Redis ACL rules (one `user ...` line each): the default user off, each service and the
    admin as `redis_rules` says. `password(user)` is the password as it is written after `>`."""
    # The default user cannot log in (off), but keeps every permission: Redis 7.0 replays the
    # append-only file's transactions (MULTI/EXEC) as the default user, and without them every
    # transaction written before a restart is refused and lost (tenants, keys, States).
    rules = ["user default off ~* &* +@all"]
    for user in REDIS_USERS:
        rules.append(" ".join(["user", user, "on", f">{password(user)}", *redis_rules(user)]))
    return rules
