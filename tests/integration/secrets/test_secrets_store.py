"""The secrets store on a real redis-server: values sealed at rest, read back only by name,
bound to their tenant and name, and rotated keys still open what they sealed."""

from __future__ import annotations

import json
import uuid

import pytest
from redis.asyncio import Redis

from shared.events import CmdOutputObservation, EventSource
from shared.secret_egress import SecretEgress
from shared.secret_names import bad_secret_name, bad_secret_value
from shared.secret_redaction import Redactor
from shared.secrets_cipher import SecretsCipher, SecretUnreadable, new_secrets_key
from shared.secrets_store import SecretNotFound, SecretsStore

pytestmark = pytest.mark.timeout(30)


def _store(redis: Redis, key: str | None = None, previous: str = "") -> SecretsStore:
    return SecretsStore(redis, SecretsCipher.from_text(key or new_secrets_key(), previous))


async def test_values_are_sealed_at_rest_and_read_back_by_name(redis: Redis) -> None:
    tenant = f"t-{uuid.uuid4().hex[:8]}"
    store = _store(redis)
    value = "ghp_" + uuid.uuid4().hex
    info, created = await store.put(tenant, "GITHUB_TOKEN", value)
    assert created and info.name == "GITHUB_TOKEN"
    raw = await redis.hgetall(f"deckhands:secrets:{tenant}")  # type: ignore[misc]
    assert value.encode() not in b"".join(raw.values())
    assert await store.read(tenant, "GITHUB_TOKEN") == value
    assert [i.name for i in await store.names(tenant)] == ["GITHUB_TOKEN"]
    _, created = await store.put(tenant, "GITHUB_TOKEN", value + "x")
    assert not created
    assert await store.read(tenant, "GITHUB_TOKEN") == value + "x"
    assert await store.missing(tenant, ["GITHUB_TOKEN", "NOPE"]) == ["NOPE"]
    with pytest.raises(SecretNotFound):
        await store.read("another-tenant", "GITHUB_TOKEN")
    assert await store.delete(tenant, "GITHUB_TOKEN")
    with pytest.raises(SecretNotFound):
        await store.read(tenant, "GITHUB_TOKEN")


async def test_a_sealed_value_moved_to_another_tenant_does_not_open(redis: Redis) -> None:
    store = _store(redis)
    a, b = f"a-{uuid.uuid4().hex[:8]}", f"b-{uuid.uuid4().hex[:8]}"
    await store.put(a, "TOKEN", "value-of-a")
    raw = await redis.hget(f"deckhands:secrets:{a}", "TOKEN")  # type: ignore[misc]
    await redis.hset(f"deckhands:secrets:{b}", "TOKEN", raw)  # type: ignore[misc]
    with pytest.raises(SecretUnreadable):
        await store.read(b, "TOKEN")


async def test_a_binding_is_sealed_with_the_value(redis: Redis) -> None:
    """Issue 27: a secret bound to hosts is read back with its binding, and a binding changed
    in Redis (to point the secret elsewhere) makes the value open no more."""
    store = _store(redis)
    tenant = f"t-{uuid.uuid4().hex[:8]}"
    bound = SecretEgress(hosts=("api.github.com",), format="Bearer {}")
    await store.put(tenant, "GITHUB_TOKEN", "ghp-bound-value", bound)
    await store.put(tenant, "PLAIN", "plain-value")
    [info, _] = await store.names(tenant)
    assert info.name == "GITHUB_TOKEN" and info.egress == bound
    task = uuid.uuid4().hex
    await store.grant(task, tenant, ["GITHUB_TOKEN", "PLAIN"])
    stored = {s.name: s for s in await store.stored_for_task(task)}
    assert stored["GITHUB_TOKEN"].egress == bound and stored["PLAIN"].egress is None
    assert "ghp-bound-value" not in repr(stored["GITHUB_TOKEN"])
    assert await store.values_for_task(task) == {
        "GITHUB_TOKEN": "ghp-bound-value",
        "PLAIN": "plain-value",
    }
    key = f"deckhands:secrets:{tenant}"
    record = json.loads(await redis.hget(key, "GITHUB_TOKEN"))  # type: ignore[misc]
    record["egress"]["hosts"] = ["attacker.example"]
    await redis.hset(key, "GITHUB_TOKEN", json.dumps(record))  # type: ignore[misc]
    with pytest.raises(SecretUnreadable):
        await store.read(tenant, "GITHUB_TOKEN")
    record["egress"] = None  # unbound: it would go into the environment
    await redis.hset(key, "GITHUB_TOKEN", json.dumps(record))  # type: ignore[misc]
    with pytest.raises(SecretUnreadable):
        await store.read(tenant, "GITHUB_TOKEN")


async def test_rotation_and_a_wrong_key(redis: Redis) -> None:
    tenant = f"t-{uuid.uuid4().hex[:8]}"
    old, new = new_secrets_key(), new_secrets_key()
    await _store(redis, old).put(tenant, "OLD_ONE", "sealed-with-old")
    assert await _store(redis, new, previous=old).read(tenant, "OLD_ONE") == "sealed-with-old"
    with pytest.raises(SecretUnreadable):
        await _store(redis, new).read(tenant, "OLD_ONE")
    with pytest.raises(ValueError, match="DECKHANDS_SECRETS_KEY"):
        SecretsCipher.from_text("too-short")


async def test_task_grants(redis: Redis) -> None:
    tenant, task = f"t-{uuid.uuid4().hex[:8]}", uuid.uuid4().hex
    store = _store(redis)
    await store.put(tenant, "A_KEY", "alpha-value")
    await store.put(tenant, "B_KEY", "beta-value")
    assert await store.values_for_task(task) == {}
    await store.grant(task, tenant, ["A_KEY"])
    assert await store.values_for_task(task) == {"A_KEY": "alpha-value"}
    await store.delete(tenant, "A_KEY")
    assert await store.values_for_task(task) == {}
    await store.forget_task(task)
    assert await store.grant_of(task) is None


def test_names_and_values() -> None:
    assert bad_secret_name("GITHUB_TOKEN") is None
    assert bad_secret_name("1ABC") is not None
    assert bad_secret_name("PATH") is not None
    assert bad_secret_name("LD_PRELOAD") is not None
    assert bad_secret_name("DECKHANDS_X") is not None
    # Whatever changes how the shell, Python, git or ssh run (issue 24): by prefix and by name.
    for name in (
        "PYTHONSTARTUP",
        "pythonpath",
        "GIT_SSH_COMMAND",
        "GIT_CONFIG_PARAMETERS",
        "SSH_ASKPASS",
        "SHELLOPTS",
        "BASHOPTS",
        "BASH_ENV",
        "ENV",
        "PS4",
        "PROMPT_COMMAND",
        "IFS",
        "HOME",
        "LD_AUDIT",
        "GLIBC_TUNABLES",
        "XDG_CONFIG_HOME",
        "OPENSSL_CONF",
        "PERL5OPT",
        "NODE_OPTIONS",
        "LC_ALL",
    ):
        reason = bad_secret_name(name)
        assert reason is not None and "reserved" in reason and repr(name) in reason, name
    assert "starting with GIT_" in (bad_secret_name("GIT_SSH_COMMAND") or "")
    for name in ("GITHUB_TOKEN", "NPM_TOKEN", "HISTORY_API_KEY", "ENVIRONMENT", "API_KEY"):
        assert bad_secret_name(name) is None, name
    assert bad_secret_value("abc") is not None
    assert bad_secret_value("a\x00bcd") is not None
    assert bad_secret_value("abcd") is None


def test_redactor_names_each_value_longest_first() -> None:
    redactor = Redactor({"SHORT": "s3cr3t", "LONG": "s3cr3t-and-more"})
    assert redactor.text("x s3cr3t-and-more y s3cr3t") == "x <secret:LONG> y <secret:SHORT>"
    assert redactor.data(b"a s3cr3t b") == b"a <secret:SHORT> b"
    event = CmdOutputObservation(
        task_id="t" * 32,
        source=EventSource.ENVIRONMENT,
        command="echo $SHORT",
        content="s3cr3t\n",
        exit_code=0,
        cwd="/workspace",
    )
    redacted = redactor.model(event)
    assert redacted.content == "<secret:SHORT>\n" and redacted.id == event.id
    assert Redactor({}).model(event) is event


def test_redacting_twice_changes_nothing() -> None:
    redactor = Redactor({"NAME": "secret"})  # a value that is part of its own placeholder
    once = redactor.text("a secret b")
    assert once == "a <secret:NAME> b"
    assert redactor.text(once) == once
