"""Helpers shared by the runtime's Docker tests."""

from __future__ import annotations

import asyncio
import json
import os
from dataclasses import dataclass
from typing import Any

import docker
import nats
import pytest
from faststream import FastStream
from nats.js import JetStreamContext
from redis.asyncio import Redis

from services.runtime.containers import LABEL_POOL
from services.runtime.main import build_runtime
from services.runtime.service import RuntimeService
from services.runtime.settings import RuntimeSettings
from shared.commands import ExecuteAction, ReleaseSandbox
from shared.egress_policy import EgressPolicy
from shared.events import (
    AgentState,
    CmdRunAction,
    EgressActivityObservation,
    EventAdapter,
    EventSource,
    RunnableAction,
    new_id,
)
from shared.settings import CommonSettings
from shared.state import Approval, ApprovedBy, Awaiting, TaskState
from shared.state_store import TaskStateStore
from shared.subjects import WORK_STREAM, Service, work_subject

__all__ = [
    "GVISOR",
    "SANDBOX_RUNTIME",
    "Controller",
    "PoolContainer",
    "Runtime",
    "await_approved",
    "cmd",
    "differs_under_gvisor",
    "eventually",
    "make_settings",
    "pool_containers",
    "remove_pool_containers",
]


# The OCI runtime these tests start sandboxes with: the engine's default (runc) unless
# DECKHANDS_DOCKER_RUNTIME names another (`runsc`: gVisor, see docs/runtime.md, "gVisor").
# Where gVisor's kernel answers differently, a test states both exact results.
SANDBOX_RUNTIME = os.environ.get("DECKHANDS_DOCKER_RUNTIME") or "runc"
GVISOR = SANDBOX_RUNTIME.startswith("runsc")


def differs_under_gvisor(reason: str) -> pytest.MarkDecorator:
    """A test whose runc result gVisor does not give, for the reason stated (docs/runtime.md,
    "gVisor"). Strict: a test that starts passing under gVisor fails, and its mark must go."""
    return pytest.mark.xfail(
        GVISOR, reason=f"gVisor (Debian's runsc 0.0~20221219): {reason}", strict=True
    )


@dataclass(frozen=True)
class PoolContainer:
    id: str
    name: str
    labels: dict[str, str]
    state: str


def pool_containers(client: docker.DockerClient, pool: str) -> list[PoolContainer]:
    """The pool's containers; the low-level list, which does not race with removals."""
    raw = client.api.containers(all=True, filters={"label": f"{LABEL_POOL}={pool}"})
    return [
        PoolContainer(c["Id"], c["Names"][0].lstrip("/"), c.get("Labels") or {}, c["State"])
        for c in raw
    ]


def remove_pool_containers(client: docker.DockerClient, pool: str) -> None:
    for container in pool_containers(client, pool):
        try:
            client.api.remove_container(container.id, v=True, force=True)
        except docker.errors.NotFound:
            pass


def make_settings(base: CommonSettings, image: str, pool: str, **overrides: Any) -> RuntimeSettings:
    common = base.model_dump(include=set(CommonSettings.model_fields))
    values: dict[str, Any] = {
        "sandbox_image": image,
        "pool_name": pool,
        "pool_min_idle": 0,
        "sandbox_memory": "256m",
        "sandbox_pids": 128,
        "sandbox_max_file_size": "8m",
        # A small quota: the workspace lives in the sandbox's memory (test_runtime_quota).
        "sandbox_workspace_size": "64m",
        "sandbox_workspace_max_size": "128m",
        "sandbox_inodes": 4096,
        "action_timeout_s": 30.0,
        "pool_health_interval_s": 2.0,
        # Tests here check egress per task: the operator allowed it (it is off by default).
        "allow_network_egress": True,
        # A stop stuck past the service's own bound would end the whole pytest process
        # (status 75, as it ended a CI run): Runtime.stop's deadline fails the test first and
        # names what every task awaits.
        "shutdown_timeout_s": STOP_DEADLINE_S + 60,
    }
    values.update(overrides)
    return RuntimeSettings(**{**common, **values})


class Runtime:
    """A running runtime app plus a controller-side view of one NATS server."""

    def __init__(self, settings: RuntimeSettings) -> None:
        self.settings = settings
        self.app: FastStream | None = None
        self._service: RuntimeService | None = None

    async def start(self) -> RuntimeService:
        self.app, self._service = build_runtime(self.settings)
        await self.app.start()
        return self.service

    @property
    def service(self) -> RuntimeService:
        assert self._service is not None
        return self._service

    async def stop(self) -> None:
        if self.app is not None:
            stopping = asyncio.ensure_future(self.app.stop())
            done, _ = await asyncio.wait({stopping}, timeout=STOP_DEADLINE_S)
            if not done:
                # Once in CI a runtime's stop never ended (the event loop idle): name what
                # every task awaits, so that the next time says where.
                stacks = "\n".join(_stack_of(task) for task in asyncio.all_tasks())
                pytest.fail(f"the runtime did not stop in {STOP_DEADLINE_S:.0f} s:\n{stacks}")
            stopping.result()
            self.app = None


STOP_DEADLINE_S = 120.0


def _stack_of(task: asyncio.Task[Any]) -> str:
    frames = task.get_stack(limit=12)
    where = " <- ".join(f"{f.f_code.co_name} ({f.f_code.co_filename}:{f.f_lineno})" for f in frames)
    return f"{task.get_name()}: {where or 'no frames'}"


class Controller:
    """Reads one task's observations from the controller's work queue."""

    def __init__(
        self,
        js: JetStreamContext,
        task_id: str,
        sub: Any,
        redis_url: str,
        network_egress: bool = False,
        workspace_mib: int | None = None,
        network: EgressPolicy | None = None,
        tenant_id: str | None = None,
    ) -> None:
        self.js, self.task_id, self.sub = js, task_id, sub
        self.tenant_id = tenant_id
        # The next orders' network scope, as a verdict's would narrow them (issue 27, item 6).
        self.scope: EgressPolicy | None = None
        self.redis_url = redis_url
        self.network_egress = network_egress
        self.workspace_mib = workspace_mib
        self.network = network
        # The egress proxy's accounts of the task's connections, set aside as they come.
        self.egress: list[EgressActivityObservation] = []

    @classmethod
    async def for_task(
        cls,
        js: JetStreamContext,
        task_id: str,
        redis_url: str,
        network_egress: bool = False,
        workspace_mib: int | None = None,
        network: EgressPolicy | None = None,
        tenant_id: str | None = None,
    ) -> Controller:
        """The task exists, as the controller would have made it (the runtime refuses work
        for a task it does not know), and its observations are read here."""
        redis = Redis.from_url(redis_url)
        try:
            await TaskStateStore(redis).create(
                TaskState(
                    task_id=task_id,
                    task="runtime test",
                    max_iterations=100,
                    agent_state=AgentState.RUNNING,
                    network_egress=network_egress,
                    workspace_mib=workspace_mib,
                    network=network,
                    tenant_id=tenant_id,
                )
            )
        finally:
            await redis.aclose()
        sub = await js.pull_subscribe(
            work_subject(Service.CONTROLLER, task_id), durable=None, stream=WORK_STREAM
        )
        return cls(js, task_id, sub, redis_url, network_egress, workspace_mib, network, tenant_id)

    async def send(self, action: RunnableAction) -> ExecuteAction:
        """Order the action as the controller does: the State first awaits it, approved (the
        runtime runs nothing else)."""
        await await_approved(self.redis_url, self.task_id, action)
        order = ExecuteAction(
            task_id=self.task_id,
            action=action,
            network_egress=self.network_egress,
            workspace_mib=self.workspace_mib,
            network=self.network,
            network_scope=self.scope,
            tenant_id=self.tenant_id,
        )
        await self.js.publish(
            work_subject(Service.RUNTIME, self.task_id),
            order.model_dump_json().encode(),
            headers={"Nats-Msg-Id": order.id},
        )
        return order

    async def release(self) -> None:
        order = ReleaseSandbox(task_id=self.task_id, reason="test over")
        await self.js.publish(
            work_subject(Service.RUNTIME, self.task_id),
            order.model_dump_json().encode(),
            headers={"Nats-Msg-Id": order.id},
        )

    async def receive(self, timeout: float = 30) -> Any:
        while True:
            msgs = await self.sub.fetch(1, timeout=timeout)
            await msgs[0].ack()
            event = EventAdapter.validate_python(json.loads(msgs[0].data))
            if not isinstance(event, EgressActivityObservation):
                return event
            self.egress.append(event)

    async def nothing_within(self, seconds: float) -> bool:
        try:
            await self.sub.fetch(1, timeout=seconds)
        except nats.errors.TimeoutError:
            return True
        return False

    async def run(self, action: RunnableAction) -> Any:
        await self.send(action)
        obs = await self.receive()
        assert obs.cause == action.id
        return obs


async def await_approved(redis_url: str, task_id: str, action: RunnableAction) -> None:
    """Make the task's State await `action` from the runtime, approved by the security
    monitor: what the controller's State holds when it sends an ExecuteAction."""
    redis = Redis.from_url(redis_url)
    try:
        store = TaskStateStore(redis)
        state = await store.load(task_id)
        assert state is not None, f"no State for task {task_id}"
        await store.save(
            state.model_copy(
                update={
                    "awaiting": Awaiting.RUNTIME,
                    "awaiting_id": action.id,
                    "pending_action": action,
                    "approval": Approval(
                        action_id=action.id, by=ApprovedBy.SECURITY, answer_id=new_id()
                    ),
                }
            )
        )
    finally:
        await redis.aclose()


def cmd(task_id: str, command: str, **kw: Any) -> CmdRunAction:
    return CmdRunAction(task_id=task_id, source=EventSource.AGENT, command=command, **kw)


async def eventually(check: Any, timeout: float = 20.0) -> None:
    for _ in range(int(timeout / 0.1)):
        if await check():
            return
        await asyncio.sleep(0.1)
    raise AssertionError("condition not reached in time")
