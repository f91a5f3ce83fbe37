"""Every hop is declared once: the AsyncAPI document (proto_schemas/asyncapi.json, generated
from the services' brokers and kept in sync by test_schemas.py) names a sender for every
receiver and a receiver for every send, and each service declares exactly the sends its NATS
credentials allow (shared/broker_permissions.py, which the server enforces in `make up` and in
Kubernetes). A send added to the code without its declaration is refused by the server; one
declared without a permission fails here, and so does a permission nobody declares."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from shared.broker_permissions import nats_permissions
from shared.subjects import Service

ROOT = Path(__file__).resolve().parents[2]
# A token the document uses for "any": NATS' wildcard, or the runtime replica's name
# (tools/gen_schemas.py names it REPLICA).
_ANY = {"*", "REPLICA"}


def _operations() -> list[tuple[str, str, str]]:
    """(action, operation title, channel address) of every operation of the document."""
    document: dict[str, Any] = json.loads((ROOT / "proto_schemas" / "asyncapi.json").read_text())
    channels = document["channels"]
    rows = []
    for title, operation in document["operations"].items():
        channel = channels[operation["channel"]["$ref"].rsplit("/", 1)[-1]]
        rows.append((operation["action"], title, channel["address"]))
    return rows


def _overlap(a: str, b: str) -> bool:
    """Whether some subject is both an `a` and a `b`."""
    left, right = a.split("."), b.split(".")
    return len(left) == len(right) and all(
        x == y or x in _ANY or y in _ANY for x, y in zip(left, right, strict=True)
    )


def _allows(pattern: str, address: str) -> bool:
    """Whether a NATS permission `pattern` admits every subject of `address`."""
    allowed, subject = pattern.split("."), address.split(".")
    if allowed[-1] == ">":  # one or more tokens more
        allowed = allowed[:-1]
        if len(subject) <= len(allowed):
            return False
        subject = subject[: len(allowed)]
    return len(allowed) == len(subject) and all(
        p == "*" or p == s for p, s in zip(allowed, subject, strict=True)
    )


def _service_of(title: str) -> str:
    return title.split(".", 1)[0]


def test_the_matching_helpers_mean_what_they_say() -> None:
    assert _overlap("deckhands.routed.runtime.*.*", "deckhands.routed.runtime.REPLICA.*")
    assert not _overlap("deckhands.work.runtime.*", "deckhands.work.reasoner.*")
    assert not _overlap("deckhands.runtime.workspace", "deckhands.runtime.workspace.*")
    assert _allows("deckhands.work.runtime.*", "deckhands.work.runtime.*")
    assert not _allows("deckhands.work.runtime.*", "deckhands.work.reasoner.*")
    assert not _allows("deckhands.work.runtime", "deckhands.work.runtime.*")
    assert _allows("deckhands.>", "deckhands.work.runtime.*")
    assert not _allows("deckhands.work.>", "deckhands.work")


def test_every_receiver_has_a_sender_and_every_send_a_receiver() -> None:
    operations = _operations()
    sends = [(title, address) for action, title, address in operations if action == "send"]
    receives = [(title, address) for action, title, address in operations if action == "receive"]
    unsent = [f"{t} ({a})" for t, a in receives if not any(_overlap(a, s) for _, s in sends)]
    unheard = [f"{t} ({a})" for t, a in sends if not any(_overlap(a, r) for _, r in receives)]
    assert not unsent, f"receivers that no service declares a send to: {unsent}"
    assert not unheard, f"declared sends that no service receives: {unheard}"


@pytest.mark.parametrize("service", [s.value for s in Service])
def test_a_service_declares_exactly_the_sends_its_credentials_allow(service: str) -> None:
    declared = [
        (title, address)
        for action, title, address in _operations()
        if action == "send" and _service_of(title) == service
    ]
    allowed = [
        pattern
        for pattern in nats_permissions(service)["publish"]
        # Its dead letters (shared.delivery) go to its own subject, which nothing consumes:
        # an operator reads them with `nats stream view`.
        if pattern.startswith("deckhands.") and not pattern.startswith("deckhands.dlq.")
    ]
    forbidden = [f"{t} ({a})" for t, a in declared if not any(_allows(p, a) for p in allowed)]
    undeclared = [p for p in allowed if not any(_overlap(p, a) for _, a in declared)]
    assert not forbidden, f"{service} declares sends its NATS user may not make: {forbidden}"
    assert not undeclared, (
        f"{service} may publish to {undeclared} (shared/broker_permissions.py) but declares no "
        "send there: declare it with broker.publisher in its main.py"
    )
