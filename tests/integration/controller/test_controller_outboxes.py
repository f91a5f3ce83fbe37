"""A task's log keeps no gap when an input's first sending failed and its redelivery comes
only after many other inputs of the task, on a real nats-server and Redis.

The State keeps the outboxes of the last eight inputs, for their redelivery to send again. An
entry logged beside the agent's own steps (a checkpoint while the agent thinks) whose sending
failed in a NATS leader election came back after more than eight inputs, found nothing to send,
and the log had a hole for good (the NATS-cluster e2e saw it in CI)."""

from __future__ import annotations

from controller_helpers import new_task, user_message  # type: ignore[import-not-found]
from redis.asyncio import Redis

from services.controller.handlers import ControllerHandlers
from services.controller.task_log import TaskLog
from shared.broker import ServiceBroker
from shared.events import MessageAction
from shared.state_store import TaskStateStore


async def test_an_input_sent_late_after_many_others_leaves_no_gap_in_the_log(
    broker: ServiceBroker, redis: Redis
) -> None:
    store = TaskStateStore(redis)
    handlers = ControllerHandlers(broker, store, cas_attempts=5)
    task_log = TaskLog(lambda: broker.config.connection_state.stream)
    task_id = await new_task(store, "list files", 50)
    await handlers.on_input(user_message(task_id, "list files"))

    # Decided and saved, but never sent: what a publish refused by an electing stream, or a
    # controller killed right after its save, leaves behind.
    lost = user_message(task_id, "and the hidden ones")
    await handlers._decide(lost)
    for i in range(12):  # more inputs than the State keeps outboxes of
        await handlers.on_input(user_message(task_id, f"note {i}"))
    await handlers.on_input(lost)  # its redelivery, at last

    state = await store.load(task_id)
    assert state is not None
    entries = await task_log.read(task_id)
    seqs = sorted({e.seq for e in entries if e.seq is not None})
    assert seqs == list(range(1, state.last_seq + 1)), f"a gap in the log: {seqs}"
    said = [e.content for e in entries if isinstance(e, MessageAction)]
    assert "and the hidden ones" in said


async def test_a_replica_sends_again_only_what_it_did_not_see_published(
    broker: ServiceBroker, redis: Redis
) -> None:
    """The outboxes a replica published itself are not sent again when they leave the State;
    another replica's are (it cannot know they went out)."""
    store = TaskStateStore(redis)
    one = ControllerHandlers(broker, store, cas_attempts=5)
    other = ControllerHandlers(broker, store, cas_attempts=5)
    task_id = await new_task(store, "list files", 50)
    for i in range(10):
        await one.on_input(user_message(task_id, f"note {i}"))
    state = await store.load(task_id)
    assert state is not None
    assert state.outbox_leaving(one._published) == []
    carried = state.outbox_leaving(other._published)
    assert carried and all(m.carried for m in carried)
    assert {m.msg_id for m in carried} <= {m.msg_id for m in next(iter(state.outboxes.values()))}
