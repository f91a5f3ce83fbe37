"""State changes go to the task's notices as well as its log (webhooks read only those), and a
consumer an earlier version left on the log is removed when the streams are declared."""

from __future__ import annotations

import nats
from nats.js.api import ConsumerConfig

from services.controller.agent_loop import apply
from services.controller.turn import Turn
from shared.events import (
    AgentState,
    AgentStateChangedObservation,
    EventAdapter,
    EventSource,
    MessageAction,
)
from shared.settings import CommonSettings
from shared.state import TaskState
from shared.streams import RETIRED_CONSUMERS, ensure_streams
from shared.subjects import (
    EVENTS_STREAM,
    NOTICES_STREAM,
    event_subject,
    notice_subject,
)

TASK = "t1"


def test_each_state_change_is_a_notice_as_logged_and_nothing_else_is() -> None:
    turn = Turn(TaskState(task_id=TASK, task="do it", max_iterations=5))
    apply(turn, MessageAction(task_id=TASK, source=EventSource.USER, content="do it"))
    turn.change_state(AgentState.PAUSED, reason="asked to")
    out = turn.outbox()
    logged = [o for o in out if o.subject == event_subject(TASK)]
    notices = [o for o in out if o.subject == notice_subject(TASK)]
    changes = [e for e in turn.logged if isinstance(e, AgentStateChangedObservation)]
    assert len(logged) == len(turn.logged) > len(changes) == len(notices) == 2
    for notice, change in zip(notices, changes, strict=True):
        assert notice.stream == NOTICES_STREAM
        assert notice.msg_id == change.id  # a redone turn's copy is deduplicated
        parsed = EventAdapter.validate_json(notice.payload)
        assert parsed == change and parsed.seq == change.seq
    # The log's own copy goes out first: a notice never names a seq the log has not had.
    assert out.index(logged[-1]) < out.index(notices[0])


async def test_the_log_consumer_webhooks_used_to_have_is_removed(
    streams: CommonSettings,
) -> None:
    assert (EVENTS_STREAM, "webhooks") in RETIRED_CONSUMERS
    nc = await nats.connect(streams.nats_url)
    js = nc.jetstream()
    try:
        await js.add_consumer(EVENTS_STREAM, ConsumerConfig(durable_name="webhooks"))
        await ensure_streams(streams)  # as tools.streams runs it: no user, or the admin
        names = [c.name for c in await js.consumers_info(EVENTS_STREAM)]
        assert "webhooks" not in names
        await ensure_streams(streams)  # nothing to remove: no error
    finally:
        await nc.close()
