"""A task whose history passes 2 MB keeps stepping: the real storage service stores the log from
JetStream and answers in pages bounded in bytes (below NATS' max_payload), and the reasoner reads
only what was logged since its last step."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import nats
import pytest
from nats.aio.client import Client
from reasoner_doubles import reasoner_settings

from services.reasoner.main import build_app as build_reasoner
from services.reasoner.metrics import HISTORY_EVENTS_READ
from services.storage.main import build_app as build_storage
from services.storage.settings import StorageSettings
from shared.commands import ReviewAction, StepRequest
from shared.events import (
    AgentState,
    AgentStateChangedObservation,
    CmdOutputObservation,
    CmdRunAction,
    EventBase,
    EventSource,
    MessageAction,
)
from shared.settings import CommonSettings
from shared.subjects import WORK_STREAM, Service, event_subject, work_subject

TASK_TEXT = "long history: keep running commands"
EARLIER_STEPS = 30
OUTPUT_BYTES = 80_000  # 30 outputs: 2.4 MB of history, twice NATS' max_payload

SCRIPT_CONVERSATIONS: list[dict[str, Any]] = [
    {
        "match": "long history",
        "turns": [
            {"tool": "execute_bash", "arguments": {"command": f"echo step {i}"}} for i in range(40)
        ],
    },
]


@pytest.fixture(scope="module")
async def stack(
    isolated_settings: CommonSettings, scripted_llm: str, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[Client]:
    common = isolated_settings.model_dump(include=set(CommonSettings.model_fields))
    storage = build_storage(
        StorageSettings(**common, data_dir=Path(tmp_path_factory.mktemp("storage")))
    )
    # No condensing: this is about delivering the history, not shrinking it.
    reasoner = build_reasoner(
        reasoner_settings(isolated_settings, scripted_llm, llm_max_input_tokens=0)
    )
    await storage.start()
    await reasoner.start()
    nc = await nats.connect(isolated_settings.nats_url)
    try:
        yield nc
    finally:
        await nc.close()
        await reasoner.stop()
        await storage.stop()


class Log:
    """Plays the controller: logs events with their seq on the events stream."""

    def __init__(self, nc: Client, task_id: str) -> None:
        self.js, self.task_id, self.seq = nc.jetstream(), task_id, 0

    async def append(self, event: EventBase) -> EventBase:
        self.seq += 1
        logged = event.model_copy(update={"seq": self.seq})
        await self.js.publish(
            event_subject(self.task_id),
            logged.model_dump_json().encode(),
            headers={"Nats-Msg-Id": logged.id},
        )
        return logged

    async def command_and_output(self, n: int) -> None:
        run = await self.append(
            CmdRunAction(
                task_id=self.task_id,
                source=EventSource.AGENT,
                command=f"echo step {n}",
                tool_call_id=f"call_{n}",
            )
        )
        await self.append(
            CmdOutputObservation(
                task_id=self.task_id,
                source=EventSource.ENVIRONMENT,
                cause=run.id,
                command=f"echo step {n}",
                content=f"{n}:" + "o" * OUTPUT_BYTES,
                exit_code=0,
                cwd="/workspace",
            )
        )


async def next_action(nc: Client, sub: Any, task_id: str, log: Log, iteration: int) -> Any:
    js = nc.jetstream()
    step = StepRequest(task_id=task_id, after_seq=log.seq, iteration=iteration)
    await js.publish(
        work_subject(Service.REASONER, task_id),
        step.model_dump_json().encode(),
        headers={"Nats-Msg-Id": step.id},
    )
    msgs = await sub.fetch(1, timeout=60)
    await msgs[0].ack()
    # A command goes to the security monitor, which passes it on to the controller.
    return ReviewAction.model_validate_json(msgs[0].data).action


def events_read() -> float:
    return HISTORY_EVENTS_READ._value.get()


async def test_a_history_past_2_mb_keeps_stepping_and_is_read_incrementally(stack: Client) -> None:
    task_id = uuid.uuid4().hex
    log = Log(stack, task_id)
    await log.append(MessageAction(task_id=task_id, source=EventSource.USER, content=TASK_TEXT))
    await log.append(
        AgentStateChangedObservation(
            task_id=task_id, source=EventSource.SYSTEM, agent_state=AgentState.RUNNING
        )
    )
    for n in range(EARLIER_STEPS):
        await log.command_and_output(n)
    assert log.seq == 2 + 2 * EARLIER_STEPS

    # What the reasoner sends the security monitor (a work-queue stream allows one reader).
    answers = await stack.jetstream().pull_subscribe(
        work_subject(Service.SECURITY, task_id), durable=None, stream=WORK_STREAM
    )
    before = events_read()
    action = await next_action(stack, answers, task_id, log, EARLIER_STEPS + 1)
    assert isinstance(action, CmdRunAction), action
    assert action.command == f"echo step {EARLIER_STEPS}"  # it saw all 30 earlier replies
    assert events_read() - before == log.seq  # the whole history, in several pages

    await log.command_and_output(EARLIER_STEPS)
    before = events_read()
    action = await next_action(stack, answers, task_id, log, EARLIER_STEPS + 2)
    assert isinstance(action, CmdRunAction), action
    assert action.command == f"echo step {EARLIER_STEPS + 1}"
    assert events_read() - before == 2  # only the action and output logged since the last step
