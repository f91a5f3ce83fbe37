"""Who writes what in Redis: one entry per kind of record, with its one writer.

Several services share one Redis. Each record kind below has exactly one writer service; the
others may read it. Redis enforces the table: each service's ACL user reads every key and
writes only the patterns it is the writer of (shared/broker_permissions.py, `redis_acl`), so a
write path this table does not name is refused by the server (NOPERM; inside a Lua script,
"can't access at least one of the keys").

Were a second service to write a record, it would be listed with the record as a named
exception (`SecondWriter`): what it writes, from where, and what ends the exception. None is
today: the gateway's creation and removal of States went to the controller, its removal of the
runtime's records to the runtime. Redis would let it write that record too;
tests/unit/test_redis_records.py fails for any exception not listed there as well, so a new one
is a decision, not an accident.

Patterns are Redis globs, written as the code builds the keys (each `{...}` of an f-string is a
`*`); tests/unit/test_redis_records.py finds every key the code builds in services/ and shared/
(f-strings, `.format` templates, and the keys the Lua scripts build from a prefix) and checks
that each is an entry here, and each entry a key of the code. Records of different writers never
share a key: no two patterns of different writers match one key.

This module is data only: it imports nothing that talks to Redis.
"""

from __future__ import annotations

from dataclasses import dataclass

from .subjects import Service

__all__ = [
    "RECORDS",
    "RedisRecord",
    "SecondWriter",
    "key_permissions",
    "read_patterns",
    "written_patterns",
]

GATEWAY = Service.GATEWAY.value
CONTROLLER = Service.CONTROLLER.value
REASONER = Service.REASONER.value
RUNTIME = Service.RUNTIME.value
# The egress proxy (services/egress): no broker service, but a Redis user of its own.
EGRESS = "egress"


@dataclass(frozen=True)
class SecondWriter:
    """A service other than the writer that writes the record today: a documented exception."""

    service: str
    writes: str  # what it writes, and from where (file and function)
    until: str  # what ends the exception


@dataclass(frozen=True)
class RedisRecord:
    pattern: str  # a Redis glob matching every key of this kind, and no other kind's
    writer: str  # the one service that writes it
    readers: tuple[str, ...]  # the services that read it (the writer too, when it does)
    module: str  # the module whose code reads and writes it
    holds: str  # what it holds, in one line
    second_writers: tuple[SecondWriter, ...] = ()

    @property
    def writers(self) -> tuple[str, ...]:
        """The writer, then each documented second writer (once each)."""
        return tuple(dict.fromkeys([self.writer, *(w.service for w in self.second_writers)]))


_ALL = (GATEWAY, CONTROLLER, REASONER, RUNTIME)
_GATEWAY_ONLY = (GATEWAY,)


def _seats(
    name: str,
    holds: str,
    *,
    gateway_reads: bool = False,
    reasoner_reads: bool = False,
    module: str = "shared.seat_scripts",
) -> RedisRecord:
    """A key of a pool's sandbox seats and fair queue (shared/admission.py), the runtime's; the
    reasoner reads whether a task is seated before its first LLM call (shared/seat_states.py)."""
    readers = (RUNTIME, *((GATEWAY,) if gateway_reads else ()))
    readers += (REASONER,) if reasoner_reads else ()
    return RedisRecord(f"deckhands:seats:*:{name}", RUNTIME, readers, module, holds)


def _llm(name: str, holds: str) -> RedisRecord:
    """A key of a model's capacity shared by the reasoner replicas."""
    pattern = f"deckhands:llm:*:{name}"
    return RedisRecord(pattern, REASONER, (REASONER,), "services.reasoner.capacity", holds)


def _runtime(pattern: str, holds: str) -> RedisRecord:
    """A binding, heartbeat or action ledger entry of the runtime (bindings.py)."""
    return RedisRecord(pattern, RUNTIME, (RUNTIME,), "services.runtime.bindings", holds)


def _gateway(pattern: str, module: str, holds: str) -> RedisRecord:
    """One of the gateway's own records, read by the gateway alone."""
    return RedisRecord(pattern, GATEWAY, _GATEWAY_ONLY, f"services.gateway.{module}", holds)


RECORDS: tuple[RedisRecord, ...] = (
    # -- a task's State (the controller's)
    RedisRecord(
        "deckhands:task:*",
        CONTROLLER,
        _ALL,
        "shared.state_store",
        "a task's State (HASH: version, state JSON), saved by compare-and-set",
    ),
    RedisRecord(
        "deckhands:deadlines",
        CONTROLLER,
        (CONTROLLER,),
        "shared.state_store",
        "ZSET task -> when its awaited answer is due, written with the State it indexes",
    ),
    RedisRecord(
        "deckhands:states-intact",
        CONTROLLER,
        (CONTROLLER, GATEWAY, RUNTIME),
        "shared.state_store",
        "marker: every live task has its State (gone: Redis lost them, the controller rebuilds)",
    ),
    # -- sandbox seats and their fair queue, per pool (the runtime's)
    _seats(
        "seats",
        "HASH task -> when it was seated: the seats taken",
        gateway_reads=True,
        reasoner_reads=True,
    ),
    _seats("starting", "ZSET task -> when it was seated, until its sandbox started"),
    _seats("owner", "HASH task -> tenant, for each task seated or queued", gateway_reads=True),
    _seats("held", "HASH tenant -> seats its tasks hold", gateway_reads=True),
    _seats(
        "queue",
        "ZSET task -> arrival ticket, every queued task",
        gateway_reads=True,
        reasoner_reads=True,
    ),
    _seats("q:*", "ZSET task -> rank: one tenant's own queue", gateway_reads=True),
    _seats("waiting", "HASH tenant -> tasks it has queued", gateway_reads=True),
    _seats("queued_at", "HASH task -> when it joined the queue"),
    _seats("ticket", "STRING the queue's arrival counter"),
    _seats("orders", "HASH task -> its order waiting for a seat (JSON), sent again once seated"),
    _seats("admitted", "ZSET task -> when seated while its order waits to be sent again"),
    _seats("released", "LIST when the latest seats freed (the wait estimate)", gateway_reads=True),
    _seats("batch", "SET tasks seated as batch ones: a starting task's kind"),
    _seats("leaves_warm", "SET tasks seated amid a burst or a backlog (warm sandboxes)"),
    _seats(
        "max_seats",
        "STRING the pool's seats (DECKHANDS_MAX_SANDBOXES), said by each runtime replica",
        reasoner_reads=True,
        module="shared.admission",
    ),
    RedisRecord(
        "deckhands:seat-weights",
        GATEWAY,
        (GATEWAY, REASONER, RUNTIME),
        "shared.admission",
        "HASH tenant -> seat weight, from the operator's limits (services/gateway/quotas/)",
    ),
    # -- tenants' secrets (the gateway's; the runtime and the controller read them)
    RedisRecord(
        "deckhands:secrets:*",
        GATEWAY,
        (GATEWAY, CONTROLLER, RUNTIME, EGRESS),
        "shared.secrets_store",
        "HASH name -> a tenant's sealed secret (JSON)",
    ),
    RedisRecord(
        "deckhands:task-secrets:*",
        GATEWAY,
        (CONTROLLER, RUNTIME, EGRESS),
        "shared.secrets_store",
        "a task's grant: its tenant and the names of the secrets it may use (JSON)",
    ),
    _gateway(
        "deckhands:secrets-intact",
        "secrets.records",
        "marker: Redis holds every secret, grant and webhook (gone: filled again from NATS)",
    ),
    # -- what a task is created with, and what its checkout leaves
    RedisRecord(
        "deckhands:trajectory:*",
        GATEWAY,
        (REASONER,),
        "shared.trajectory",
        "the trajectory a task replays (a JSON array of events)",
    ),
    RedisRecord(
        "deckhands:repository:*",
        GATEWAY,
        (RUNTIME,),
        "shared.workspace",
        "the repository a task starts from, and its tenant (JSON)",
    ),
    RedisRecord(
        "deckhands:repository-checked-out:*",
        RUNTIME,
        (RUNTIME,),
        "shared.workspace",
        "the sandbox and commit a task's repository was checked out into",
    ),
    RedisRecord(
        "deckhands:instructions:*",
        RUNTIME,
        (REASONER,),
        "shared.workspace",
        "the repository instructions (AGENTS.md) of a task's workspace, path and text (JSON)",
    ),
    # -- the gateway's own records
    _gateway(
        "deckhands:idempotency:*:*", "tasks.idempotency", "an Idempotency-Key's request and result"
    ),
    _gateway("deckhands:task-record:*", "tasks.records", "a task's owner, labels, creation time"),
    RedisRecord(
        "deckhands:task-creation:*",
        GATEWAY,
        (GATEWAY, CONTROLLER),
        "shared.task_creation",
        "the request to make a task the gateway sent the controller, shown until its State exists",
    ),
    _gateway("deckhands:tenant:*:tasks", "tasks.records", "ZSET a tenant's tasks, newest first"),
    _gateway(
        "deckhands:tenant:*:tasks-complete",
        "tasks.records",
        "marker: the tenant's index holds every record (gone: built again from NATS)",
    ),
    _gateway("deckhands:tenant:*", "tenants.store", "a tenant, disabled or deleted or not (JSON)"),
    _gateway("deckhands:apikey-hash:*", "tenants.store", "an API key hash's credential, or '-'"),
    _gateway("deckhands:apikey-used:*", "tenants.store", "when an API key was last used"),
    _gateway(
        "deckhands:tenant:*:limits", "quotas.records", "the operator's limits of a tenant (JSON)"
    ),
    _gateway(
        "deckhands:tenant:*:running", "quotas.records", "HASH task -> reservation: tasks running"
    ),
    _gateway(
        "deckhands:tenant:*:holders",
        "quotas.records",
        "HASH root task -> the trees that may hold seats",
    ),
    _gateway(
        "deckhands:tenant:*:spend:*", "quotas.records", "what a tenant spent or reserved on a day"
    ),
    _gateway(
        "deckhands:tenant:*:counts-complete",
        "quotas.records",
        "marker: the tenant's quota counts are whole (gone: counted again from its tasks)",
    ),
    _gateway(
        "deckhands:tenant:*:counts-complete:lock",
        "quotas.records",
        "lock: one gateway counts a tenant's quotas again at a time",
    ),
    _gateway("deckhands:webhook:tenant:*", "webhooks.store", "a tenant's default webhook (JSON)"),
    _gateway("deckhands:webhook:task:*", "webhooks.store", "the webhook a task notifies (JSON)"),
    _gateway("deckhands:webhook:delivery:*", "webhooks.store", "HASH a notification's attempts"),
    _gateway("deckhands:webhook:log:*", "webhooks.store", "LIST a task's delivery attempts (JSON)"),
    # -- a tenant's egress bytes per day (shared/egress_usage.py)
    RedisRecord(
        "deckhands:egress-allowances",
        GATEWAY,
        (GATEWAY, EGRESS),
        "shared.egress_usage",
        "HASH tenant -> the egress bytes it may move a UTC day, from the operator's limits",
    ),
    RedisRecord(
        "deckhands:egress-bytes:*:*",
        EGRESS,
        (EGRESS, GATEWAY),
        "shared.egress_usage",
        "the egress bytes a tenant's sandboxes moved on a UTC day, both ways",
    ),
    # -- an LLM's shared capacity, per model (the reasoner's)
    _llm("inflight", "ZSET lease -> when it expires: the calls in flight"),
    _llm("recent", "ZSET lease -> when it was granted, the last 60 s"),
    _llm("tokens", "HASH lease -> tokens it used (or was estimated to)"),
    _llm("tenant", "HASH lease -> its tenant"),
    _llm("wanting", "HASH tenant -> when it last asked for room in vain"),
    _llm("paused_until", "unix time until which the provider asked (429) not to be called"),
    _llm("learned", "the calls in flight when the provider last refused one: a cap"),
    # -- the runtime's records
    _runtime("deckhands:runtime:*:task:*", "a task's sandbox: <container>@<replica> (SET NX)"),
    _runtime("deckhands:runtime:*:stopped:*", "when a waiting task's sandbox was stopped"),
    _runtime("deckhands:runtime:*:intact:*", "marker: Redis holds what a runtime process wrote"),
    _runtime("deckhands:runtime:*:replica:*", "a runtime process's heartbeat"),
    _runtime("deckhands:runtime:*:name:*", "a runtime replica name's heartbeat"),
    _runtime("deckhands:runtime:observation:*", "the observation published for an action"),
    _runtime("deckhands:runtime:running:*", "the process running an action"),
    _runtime("deckhands:runtime:started:*", "marker: the action was sent to a sandbox"),
    RedisRecord(
        "deckhands:retained:*",
        RUNTIME,
        (RUNTIME,),
        "services.runtime.retention",
        "ZSET ended task -> until when its paused sandbox is kept for its workspace",
    ),
    *(
        RedisRecord(
            f"deckhands:checkpoint-bytes:{name}",
            RUNTIME,
            (RUNTIME,),
            "services.runtime.checkpoint_quota",
            f"HASH {holds}",
        )
        for name, holds in (
            ("task", "task -> bytes its checkpoints take in the store"),
            ("tenant", "tenant -> bytes its tasks' checkpoints take in the store"),
            ("task-tenant", "task -> its tenant (whose count a deleted task's bytes leave)"),
        )
    ),
)


def read_patterns(service: str) -> tuple[str, ...]:
    """The patterns `service` reads but does not write: for a user that may read only those."""
    written = set(written_patterns(service))
    return tuple(
        dict.fromkeys(
            r.pattern for r in RECORDS if service in r.readers and r.pattern not in written
        )
    )


def written_patterns(service: str) -> tuple[str, ...]:
    """The patterns `service` may write: of the records it is the writer of, or a documented
    second writer of, in the table's order."""
    return tuple(dict.fromkeys(record.pattern for record in RECORDS if service in record.writers))


def key_permissions(service: str) -> list[str]:
    """`service`'s Redis ACL key rules: read every key, read and write its own.

    Redis 7.0 checks a command's keys one key specification at a time, and a key a command
    both reads and writes (HINCRBY, SET ... GET, INCR) needs one pattern granting both: the
    owned patterns are `%RW~`, not `%W~`."""
    return ["%R~*", *(f"%RW~{pattern}" for pattern in written_patterns(service))]
