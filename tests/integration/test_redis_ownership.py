"""Redis itself enforces shared/redis_records.py: on a redis-server started with the ACL
shared/broker_permissions.py derives from the table, each service user writes a key of every
record it is a writer of, is refused (NOPERM) writing any other, also from inside a Lua script,
and reads every key. The stores run as their services do (the Lua scripts name their keys from
an argument, and Redis checks those too)."""

from __future__ import annotations

import re
import secrets
import subprocess
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from redis.asyncio import Redis
from redis.exceptions import NoPermissionError, ResponseError

from shared.admission import SandboxSeats, queue_place
from shared.broker_permissions import ADMIN_USER, EGRESS_USER, REDIS_USERS, redis_acl
from shared.events import AgentState
from shared.redis_client import connect_redis
from shared.redis_records import RECORDS, RedisRecord
from shared.settings import CommonSettings
from shared.state import TaskState
from shared.state_store import TaskStateStore
from tools.procs import free_port, start_redis

# The egress proxy's user reads only some records and runs no script: tested on its own below.
SERVICES = tuple(user for user in REDIS_USERS if user not in (ADMIN_USER, EGRESS_USER))
# Redis 7.0 answers a refused key inside a script "The user executing the script can't access
# at least one of the keys..."; later versions may say NOPERM.
_REFUSED_IN_SCRIPT = re.compile(r"NOPERM|no permissions|can't access", re.IGNORECASE)
_WRITE = "return redis.call('SET', ARGV[1], ARGV[2])"
_READ = "return redis.call('GET', ARGV[1])"


@dataclass(frozen=True)
class AclRedis:
    url: str
    passwords: dict[str, str]

    def connect(self, user: str) -> Redis:
        """A client as the services make one (shared.redis_client), logged in as `user`."""
        settings = CommonSettings(
            redis_url=self.url, redis_user=user, redis_password=self.passwords[user]
        )
        return connect_redis(self.url, settings)


@pytest.fixture(scope="module")
def acl_redis(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AclRedis]:
    root: Path = tmp_path_factory.mktemp("redis-acl")
    passwords = {user: secrets.token_urlsafe(18) for user in REDIS_USERS}
    acl_file = root / "users.acl"
    acl_file.write_text("\n".join(redis_acl(lambda user: passwords[user])) + "\n")
    port = free_port()
    proc: subprocess.Popen[bytes] = start_redis(
        port, root / "data", root / "redis.log", acl_file=acl_file
    )
    yield AclRedis(f"redis://127.0.0.1:{port}/0", passwords)
    proc.terminate()
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()


@pytest.fixture(scope="module")
async def clients(acl_redis: AclRedis) -> AsyncIterator[dict[str, Redis]]:
    made = {user: acl_redis.connect(user) for user in REDIS_USERS}
    yield made
    for client in made.values():
        await client.aclose()


def _key(record: RedisRecord) -> str:
    return record.pattern.replace("*", "probe")


def _id(record: RedisRecord) -> str:
    return record.pattern


@pytest.mark.parametrize("record", RECORDS, ids=_id)
async def test_each_writer_writes_its_records(
    clients: dict[str, Redis], record: RedisRecord
) -> None:
    key = _key(record)
    for user in record.writers:
        client = clients[user]
        assert await client.set(key, f"by {user}")
        if user != EGRESS_USER:
            assert await client.eval(_WRITE, 0, key, f"by {user} in a script")
        await client.delete(key)
    # A key both read and written by one command (HINCRBY, SET ... GET) needs %RW~, not %W~.
    writer = clients[record.writer]
    assert await writer.set(key, "1", get=True) is None
    assert await writer.incr(key) == 2
    assert await writer.delete(key) == 1


@pytest.mark.parametrize("record", RECORDS, ids=_id)
async def test_no_other_service_writes_a_record(
    clients: dict[str, Redis], record: RedisRecord
) -> None:
    key = _key(record)
    admin = clients[ADMIN_USER]
    await admin.set(key, "kept")
    others = [user for user in SERVICES if user not in record.writers]
    for user in others:
        client = clients[user]
        with pytest.raises(NoPermissionError):
            await client.set(key, f"by {user}")
        with pytest.raises(NoPermissionError):
            await client.delete(key)
        with pytest.raises(NoPermissionError):
            await client.expire(key, 1)
        with pytest.raises(NoPermissionError):  # refused before its type is looked at
            await client.hset(key, "field", "1")
        with pytest.raises(NoPermissionError):
            await client.zadd(key, {"member": 1})
        with pytest.raises(ResponseError, match=_REFUSED_IN_SCRIPT):
            await client.eval(_WRITE, 0, key, f"by {user} in a script")
    assert await admin.get(key) == b"kept"
    await admin.delete(key)


@pytest.mark.parametrize("record", RECORDS, ids=_id)
async def test_every_service_reads_every_record(
    clients: dict[str, Redis], record: RedisRecord
) -> None:
    key = _key(record)
    admin = clients[ADMIN_USER]
    await admin.set(key, "value")
    for user in SERVICES:
        client = clients[user]
        assert await client.get(key) == b"value"
        assert await client.exists(key) == 1
        assert await client.ttl(key) == -1
        assert await client.eval(_READ, 0, key) == b"value"
    await admin.delete(key)


async def test_the_dangerous_commands_stay_refused(clients: dict[str, Redis]) -> None:
    for user in SERVICES:
        with pytest.raises(NoPermissionError):
            await clients[user].flushall()
        with pytest.raises(NoPermissionError):
            await clients[user].keys("*")


# --- the stores, as their services run them ---------------------------------------------------


def _state(task_id: str) -> TaskState:
    return TaskState(
        task_id=task_id, task="probe", agent_state=AgentState.LOADING, max_iterations=5
    )


async def test_states_are_the_controller_s_alone(
    clients: dict[str, Redis],
) -> None:
    controller = TaskStateStore(clients["controller"])
    # The controller makes, saves and removes States; every other service only reads them.
    assert await controller.create(_state("own-1"))
    saved = await controller.save((await controller.load("own-1")) or _state("own-1"))
    assert saved.version == 2
    await controller.mark_intact()
    for user in ("gateway", "runtime", "reasoner"):
        store = TaskStateStore(clients[user])
        assert (await store.load("own-1")) is not None
        assert await store.intact()
        with pytest.raises(ResponseError, match=_REFUSED_IN_SCRIPT):
            await store.create(_state(f"own-{user}"))
        with pytest.raises(NoPermissionError):
            await store.mark_intact()
        with pytest.raises(NoPermissionError):
            await store.delete("own-1")  # a deleted task's State goes by the controller
    await controller.delete("own-1")
    assert await controller.load("own-1") is None


async def test_seats_are_the_runtime_s(clients: dict[str, Redis]) -> None:
    pool = f"own-{secrets.token_hex(4)}"
    seats = SandboxSeats(clients["runtime"], pool, max_seats=1)
    first = await seats.admit("task-1", tenant_id="t1")
    assert first.seated
    second = await seats.admit("task-2", '{"order": 2}', tenant_id="t2")
    assert not second.seated
    # The gateway reads the queue (a task's place) but never writes it.
    place = await queue_place(clients["gateway"], pool, "task-2")
    assert place is not None and place.position == 1
    for user in ("gateway", "controller", "reasoner"):
        foreign = SandboxSeats(clients[user], pool, max_seats=1)
        with pytest.raises(ResponseError, match=_REFUSED_IN_SCRIPT):
            await foreign.admit("task-3", tenant_id="t3")
        with pytest.raises(ResponseError, match=_REFUSED_IN_SCRIPT):
            await foreign.release("task-1")
        assert await foreign.counts() == (1, 1)
    assert await seats.release("task-1")
    orders, seated = await seats.pump()
    assert orders == ['{"order": 2}'] and [s.task_id for s in seated] == ["task-2"]
    assert await seats.release("task-2")


async def test_the_egress_proxy_reaches_only_its_records(clients: dict[str, Redis]) -> None:
    """Issue 27: it reads the secrets bound to hosts, the grants and the egress allowances,
    writes the egress bytes it counts, and nothing else: a proxy broken into reads no State,
    changes no seat, runs no script."""
    egress, admin = clients[EGRESS_USER], clients[ADMIN_USER]
    for record in RECORDS:
        key = _key(record)
        await admin.set(key, "value")
        if EGRESS_USER in record.readers:
            assert await egress.get(key) == b"value", record
        else:
            with pytest.raises(NoPermissionError):
                await egress.get(key)
        if EGRESS_USER not in record.writers:
            with pytest.raises(NoPermissionError):
                await egress.set(key, "by egress")
        await admin.delete(key)
    bytes_key = "deckhands:egress-bytes:tenant:2026-11-28"
    assert await egress.incrby(bytes_key, 10) == 10
    assert await egress.expire(bytes_key, 60)
    with pytest.raises(NoPermissionError):
        await egress.eval(_READ, 0, bytes_key)
    with pytest.raises(NoPermissionError):
        await egress.keys("*")
    await admin.delete(bytes_key)
