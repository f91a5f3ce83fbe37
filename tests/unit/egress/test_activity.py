"""The egress proxy's account of each task's connections (services/egress/activity.py): one log
entry per task and second, bounded, and never a wait or a crash when it cannot be sent."""

from __future__ import annotations

from datetime import UTC, datetime

from services.egress.activity import Activity
from services.egress.metrics import ACTIVITY_DROPPED
from shared.events import MAX_CONNECTIONS_PER_ENTRY, EgressActivityObservation, EgressConnection


def _connection(host: str, allowed: bool = True) -> EgressConnection:
    return EgressConnection(
        host=host,
        port=443,
        allowed=allowed,
        reason="" if allowed else "not_allowed",
        started_at=datetime.now(UTC),
    )


async def test_each_task_gets_one_entry_with_its_connections_in_order() -> None:
    sent: list[EgressActivityObservation] = []

    async def publish(entry: EgressActivityObservation) -> None:
        sent.append(entry)

    activity = Activity(publish, 1.0)
    activity.record("a", _connection("pypi.org"))
    activity.record("b", _connection("evil.example.com", allowed=False))
    activity.record("a", _connection("files.pythonhosted.org"))
    await activity.flush()
    by_task = {e.task_id: [c.host for c in e.connections] for e in sent}
    assert by_task == {"a": ["pypi.org", "files.pythonhosted.org"], "b": ["evil.example.com"]}
    await activity.flush()
    assert len(sent) == 2  # nothing new: nothing sent


async def test_a_flood_of_connections_is_counted_past_what_one_entry_holds() -> None:
    sent: list[EgressActivityObservation] = []

    async def publish(entry: EgressActivityObservation) -> None:
        sent.append(entry)

    activity = Activity(publish, 1.0)
    for i in range(MAX_CONNECTIONS_PER_ENTRY + 25):
        activity.record("a", _connection(f"h{i}.example.com"))
    await activity.flush()
    [entry] = sent
    assert len(entry.connections) == MAX_CONNECTIONS_PER_ENTRY and entry.more == 25


async def test_an_entry_that_cannot_be_sent_is_counted_and_the_rest_go_on() -> None:
    sent: list[str] = []

    async def publish(entry: EgressActivityObservation) -> None:
        if entry.task_id == "down":
            raise ConnectionError("not connected to NATS yet")
        sent.append(entry.task_id)

    before = ACTIVITY_DROPPED._value.get()
    activity = Activity(publish, 1.0)
    activity.record("down", _connection("pypi.org"))
    activity.record("up", _connection("pypi.org"))
    await activity.flush()
    assert sent == ["up"]
    assert ACTIVITY_DROPPED._value.get() == before + 1


async def test_without_nats_the_connections_are_only_counted_here() -> None:
    activity = Activity(None, 1.0)
    activity.record("a", _connection("pypi.org"))
    await activity.flush()  # no publisher: nothing to do, nothing raised
