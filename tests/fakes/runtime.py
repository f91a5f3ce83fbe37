"""The runtime's parts on the fake engine (tests/fakes/engine.py) and a real Redis: what the
unit tests of the runtime's logic drive, as the controller would, with no Docker and no NATS.

`RuntimeHarness` makes a RuntimeService, records what it publishes and sends again, and
writes the tasks' States as the controller does (an order runs only when the State awaits it,
approved: services/runtime/order_check.py).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

from services.runtime.containers import task_container_name
from services.runtime.service import Engine, RuntimeService
from services.runtime.settings import RuntimeSettings
from shared.commands import ExecuteAction, PrepareSandbox
from shared.events import (
    AgentState,
    CmdRunAction,
    EventBase,
    EventSource,
    RunnableAction,
    new_id,
)
from shared.state import Approval, ApprovedBy, Awaiting, TaskState
from shared.state_store import TaskStateStore
from tests.fakes.engine import FAKE_ENGINE, FakeContainer, FakeEngine, engine_of

__all__ = ["FakeRuntime", "RuntimeHarness", "cmd", "unit_settings"]


def unit_settings(redis_url: str, **overrides: Any) -> RuntimeSettings:
    """Settings of a pool of the test's own (its Redis keys apart from every other test's)."""
    values: dict[str, Any] = {
        "nats_url": "nats://127.0.0.1:1",  # never connected to
        "redis_url": redis_url,
        "pool_name": f"unit-{uuid.uuid4().hex[:10]}",
        "runtime_replica": "unit-replica",
        "pool_min_idle": 0,
        "pool_health_interval_s": 600.0,  # upkeep runs when a test calls it
        "max_deliveries": 3,
    }
    values.update(overrides)
    return RuntimeSettings(**values)


def cmd(task_id: str, command: str) -> CmdRunAction:
    return CmdRunAction(task_id=task_id, source=EventSource.AGENT, command=command)


class RuntimeHarness:
    """A RuntimeService on the fake engine, and what it published (see the module docstring)."""

    def __init__(
        self,
        settings: RuntimeSettings,
        engine: Engine = FAKE_ENGINE,
        service: RuntimeService | None = None,
    ) -> None:
        """`service`: one made elsewhere on the fake engine (build_runtime's, which publishes
        to its broker: `published` and `resent` stay empty)."""
        self.settings = settings
        self.published: list[EventBase] = []
        self.resent: list[ExecuteAction | PrepareSandbox] = []
        self.service = service or RuntimeService(
            settings, self._publish, self._resend, engine=engine
        )
        self.engine: FakeEngine = engine_of(self.service.docker)
        self.states = TaskStateStore(self.service.redis)
        self._others: list[RuntimeHarness] = []
        self._closed = False

    async def _publish(self, event: EventBase) -> None:
        self.published.append(event)

    async def _resend(self, order: ExecuteAction | PrepareSandbox) -> None:
        self.resent.append(order)

    def another_process(self) -> RuntimeHarness:
        """A second runtime process of this replica on the same engine and Redis (a restart,
        or a sibling); closed with this one."""
        other = RuntimeHarness(self.settings, self.engine.another_process())
        self._others.append(other)
        return other

    async def close(self) -> None:
        for other in self._others:
            await other.close()
        if not self._closed:
            self._closed = True
            await self.service.stop()

    # -- tasks, as the controller keeps them

    async def task(self, agent_state: AgentState = AgentState.RUNNING) -> str:
        task_id = uuid.uuid4().hex
        await self.states.mark_intact()  # the controller's marker: every State is there
        state = TaskState(task_id=task_id, task="unit", max_iterations=50, agent_state=agent_state)
        assert await self.states.create(state)
        return task_id

    async def set_state(self, task_id: str, agent_state: AgentState) -> None:
        state = await self.states.load(task_id)
        assert state is not None
        await self.states.save(state.model_copy(update={"agent_state": agent_state}))

    async def approve(self, action: RunnableAction) -> None:
        """The task's State awaits `action` from the runtime, approved by the security
        monitor: what it holds when the controller sends the ExecuteAction."""
        state = await self.states.load(action.task_id)
        assert state is not None, f"no State for task {action.task_id}"
        await self.states.save(
            state.model_copy(
                update={
                    "agent_state": AgentState.RUNNING,
                    "awaiting": Awaiting.RUNTIME,
                    "awaiting_id": action.id,
                    "pending_action": action,
                    "approval": Approval(
                        action_id=action.id, by=ApprovedBy.SECURITY, answer_id=new_id()
                    ),
                }
            )
        )

    async def order(self, action: RunnableAction) -> ExecuteAction:
        await self.approve(action)
        return ExecuteAction(task_id=action.task_id, action=action)

    async def run(self, task_id: str, command: str) -> EventBase:
        """Order a command and return the observation published for it."""
        action = cmd(task_id, command)
        await self.service.execution.execute(await self.order(action))
        answer = self.published[-1]
        assert answer.cause == action.id, answer
        return answer

    # -- what the engine and Redis hold for a task

    def container_of(self, task_id: str) -> FakeContainer:
        sandbox = self.service.tasks.local(task_id)
        assert sandbox is not None, f"task {task_id} has no sandbox here"
        return self.engine.containers[sandbox.container_id]

    async def bound(self, task_id: str) -> str | None:
        return await self.service.bindings.get(task_id)

    async def seated(self) -> set[str]:
        return set(await self.service.seats.seated())

    def named_for(self, task_id: str) -> FakeContainer | None:
        return self.engine.named(task_container_name(task_id))


# The unit tests' fixture (tests/unit/runtime/conftest.py): a harness, settings as asked.
FakeRuntime = Callable[..., RuntimeHarness]
