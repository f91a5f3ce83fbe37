"""On Kubernetes NATS and Redis know exactly the users of shared/broker_permissions.py: the
ConfigMap's auth.conf is that module's rendering, every password comes from a Secret, and
every service logs in as itself."""

from __future__ import annotations

import pytest
from k8s_manifests import TARGETS, by_name, render, workloads

from shared.broker_permissions import NATS_USERS, REDIS_USERS, nats_authorization, redis_rules


@pytest.mark.parametrize("target", TARGETS)
def test_nats_users_are_the_code_s_with_passwords_from_the_secret(target: str) -> None:
    documents = render(target)
    auth = by_name(documents, "ConfigMap")["nats-config"]["data"]["auth.conf"]
    assert auth == nats_authorization(lambda user: f"$NATS_PASSWORD_{user.upper()}")
    [nats] = by_name(documents, "StatefulSet")["nats"]["spec"]["template"]["spec"]["containers"]
    secrets = {
        e["name"]: e["valueFrom"]["secretKeyRef"]
        for e in nats["env"]
        if "secretKeyRef" in e.get("valueFrom", {})
    }
    for user in NATS_USERS:
        assert secrets[f"NATS_PASSWORD_{user.upper()}"] == {
            "name": "deckhands-nats-users",
            "key": user,
        }


@pytest.mark.parametrize("target", TARGETS)
def test_every_service_logs_in_as_itself(target: str) -> None:
    for workload in workloads(render(target)):
        name = workload["metadata"]["name"]
        if name not in NATS_USERS:
            continue
        [container] = workload["spec"]["template"]["spec"]["containers"]
        env = {e["name"]: e for e in container.get("env", [])}
        assert env["DECKHANDS_NATS_USER"]["value"] == name, (target, name)
        ref = env["DECKHANDS_NATS_PASSWORD"]["valueFrom"]["secretKeyRef"]
        assert ref == {"name": "deckhands-nats-users", "key": name}
        if name in REDIS_USERS:
            assert env["DECKHANDS_REDIS_USER"]["value"] == name
            ref = env["DECKHANDS_REDIS_PASSWORD"]["valueFrom"]["secretKeyRef"]
            assert ref == {"name": "deckhands-redis-users", "key": name}
        else:
            assert "DECKHANDS_REDIS_PASSWORD" not in env


def test_redis_turns_the_default_user_off() -> None:
    [redis] = by_name(render("base"), "StatefulSet")["redis"]["spec"]["template"]["spec"][
        "containers"
    ]
    args = redis["args"]
    assert args[args.index("default") - 1 : args.index("default") + 2] == [
        "--user",
        "default",
        "off",
    ]
    for user in REDIS_USERS:
        assert f">$(REDIS_PASSWORD_{user.upper()})" in args


@pytest.mark.parametrize("target", TARGETS)
def test_redis_users_are_the_code_s(target: str) -> None:
    """Each user's rules are shared/broker_permissions.py's: a service writes only the records
    of shared/redis_records.py it is the writer of."""
    [redis] = by_name(render(target), "StatefulSet")["redis"]["spec"]["template"]["spec"][
        "containers"
    ]
    args = redis["args"]
    starts = [i for i, arg in enumerate(args) if arg == "--user"]
    users = {}
    for start, end in zip(starts, [*starts[1:], len(args)], strict=True):
        users[args[start + 1]] = args[start + 2 : end]
    assert users["default"] == ["off"]
    assert sorted(users) == sorted(["default", *REDIS_USERS])
    for user in REDIS_USERS:
        assert users[user] == ["on", f">$(REDIS_PASSWORD_{user.upper()})", *redis_rules(user)]
