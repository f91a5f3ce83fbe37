"""Seats and kept sandboxes (services/runtime/seating.py, retention.py) on the fake engine and
a real Redis: a task beyond the pool's seats queues and runs once one frees, a prepared
sandbox is the one the first action uses, an ended task's sandbox is kept paused (found again
when the task resumes, removed when its time is up or the pool keeps too many), and the seat
of a task whose release was lost is freed. The Docker tests of the same:
tests/integration/runtime/test_runtime_service.py and test_runtime_workspace.py."""

from __future__ import annotations

import asyncio

from shared.commands import ExecuteAction, PrepareSandbox, ReleaseSandbox
from shared.events import (
    AgentState,
    CmdOutputObservation,
    EventSource,
    FileReadAction,
    FileReadObservation,
    FileWriteAction,
    SandboxQueuedObservation,
)
from tests.fakes.runtime import FakeRuntime, RuntimeHarness, cmd


async def _end(rt: RuntimeHarness, task_id: str) -> None:
    """The task finished, and the controller ordered its sandbox released."""
    await rt.set_state(task_id, AgentState.FINISHED)
    await rt.service.seating.release(ReleaseSandbox(task_id=task_id, reason="finished"))


async def test_beyond_the_seats_an_order_queues_and_is_sent_again_once_one_frees(
    fake_runtime: FakeRuntime,
) -> None:
    rt = fake_runtime(max_sandboxes=1, workspace_retention_s=0)
    first, second = await rt.task(), await rt.task()
    await rt.run(first, "echo first")
    [first_container] = rt.engine.ops("create")

    waiting = await rt.order(cmd(second, "echo second"))
    await rt.service.execution.execute(waiting)
    queued = rt.published[-1]
    assert isinstance(queued, SandboxQueuedObservation) and queued.cause == waiting.action.id
    assert (queued.position, queued.max_sandboxes) == (1, 1)
    assert rt.engine.ops("create") == [first_container]  # nothing started for it
    assert rt.engine.commands_run() == ["echo first"] and rt.resent == []
    assert await rt.seated() == {first}

    await _end(rt, first)  # its seat frees: the queued order is sent again
    assert first_container not in rt.engine.containers and await rt.bound(first) is None
    [resent] = rt.resent
    assert resent == waiting and await rt.seated() == {second}
    assert isinstance(resent, ExecuteAction)
    await rt.service.execution.execute(resent)
    ran = rt.published[-1]
    assert isinstance(ran, CmdOutputObservation) and ran.cause == waiting.action.id
    assert rt.engine.commands_run() == ["echo first", "echo second"]


async def test_a_prepared_sandbox_is_bound_ahead_and_used_by_the_first_action(
    fake_runtime: FakeRuntime,
) -> None:
    rt = fake_runtime()
    task_id = await rt.task()
    await rt.service.seating.prepare(PrepareSandbox(task_id=task_id))
    prepared = await rt.bound(task_id)
    assert prepared is not None and prepared in rt.engine.containers
    assert task_id in await rt.seated() and rt.engine.commands_run() == []

    await rt.run(task_id, "echo ready")
    assert rt.engine.ops("create") == [prepared] and await rt.bound(task_id) == prepared

    # A task that ended before its preparation came gets nothing.
    ended = await rt.task(AgentState.STOPPED)
    await rt.service.seating.prepare(PrepareSandbox(task_id=ended))
    assert await rt.bound(ended) is None and ended not in await rt.seated()
    assert rt.engine.ops("create") == [prepared]


async def test_an_ended_tasks_sandbox_is_kept_paused_and_found_again_when_it_resumes(
    fake_runtime: FakeRuntime,
) -> None:
    rt = fake_runtime(workspace_retention_s=60)
    task_id = await rt.task()
    write = FileWriteAction(
        task_id=task_id, source=EventSource.AGENT, path="notes.txt", content="kept\n"
    )
    await rt.service.execution.execute(await rt.order(write))
    container = rt.container_of(task_id)

    await _end(rt, task_id)
    assert rt.engine.ops("pause") == [container.id] and container.status == "paused"
    assert rt.engine.ops("remove") == []
    assert await rt.bound(task_id) == container.id  # its binding stays
    assert task_id not in await rt.seated()  # its seat went to others
    assert await rt.service.kept.is_retained(task_id)
    assert (await rt.service.upkeep.reconcile()).removed == 0  # kept, not a leftover

    # A message resumes the task: its next action finds the same sandbox, files and all.
    read = FileReadAction(task_id=task_id, source=EventSource.AGENT, path="notes.txt")
    await rt.service.execution.execute(await rt.order(read))
    answer = rt.published[-1]
    assert isinstance(answer, FileReadObservation) and answer.content == "kept\n"
    assert rt.engine.ops("unpause") == [container.id] and container.status == "running"
    assert rt.container_of(task_id) is container and rt.engine.ops("create") == [container.id]
    assert task_id in await rt.seated()


async def test_kept_sandboxes_are_removed_when_their_time_is_up_or_their_task_is_deleted(
    fake_runtime: FakeRuntime,
) -> None:
    rt = fake_runtime(workspace_retention_s=0.5)
    expiring, deleted = await rt.task(), await rt.task()
    containers = {}
    for task_id in (expiring, deleted):
        await rt.run(task_id, "echo work")
        containers[task_id] = rt.container_of(task_id).id
        await _end(rt, task_id)

    status = rt.service.status
    assert await rt.service.kept.sweep(status.is_over, status.is_gone) == 0  # both still kept
    await rt.states.delete(deleted)  # the user deleted the task: its workspace goes at once
    assert await rt.service.kept.sweep(status.is_over, status.is_gone) == 1
    assert containers[deleted] not in rt.engine.containers
    assert containers[expiring] in rt.engine.containers

    await asyncio.sleep(0.6)  # the other's retention is over
    assert await rt.service.kept.sweep(status.is_over, status.is_gone) == 1
    assert containers[expiring] not in rt.engine.containers
    assert await rt.bound(expiring) is None and await rt.bound(deleted) is None
    assert await rt.service.kept.retention.all() == []


async def test_the_pool_keeps_at_most_its_cap_of_ended_tasks_sandboxes(
    fake_runtime: FakeRuntime,
) -> None:
    rt = fake_runtime(workspace_retained_max=2)
    tasks = [await rt.task() for _ in range(3)]
    containers = {}
    for task_id in tasks:
        await rt.run(task_id, "echo mine")
        containers[task_id] = rt.container_of(task_id).id
    for task_id in tasks:  # they end one after another, the first the oldest
        await _end(rt, task_id)

    oldest, *newest = tasks
    assert containers[oldest] not in rt.engine.containers and await rt.bound(oldest) is None
    for task_id in newest:
        assert rt.engine.containers[containers[task_id]].status == "paused"
        assert await rt.service.kept.is_retained(task_id)
    assert sorted(await rt.service.kept.retention.all()) == sorted(newest)


async def test_the_seat_of_a_task_that_ended_while_its_release_was_lost_is_freed(
    fake_runtime: FakeRuntime,
) -> None:
    rt = fake_runtime(workspace_retention_s=0)
    ended, running = await rt.task(), await rt.task()
    for task_id in (ended, running):
        await rt.run(task_id, "echo hi")
    ended_container = rt.container_of(ended).id
    await rt.set_state(ended, AgentState.FINISHED)  # its ReleaseSandbox never came

    assert await rt.service.upkeep.free_stale_seats() == 1
    assert await rt.seated() == {running}
    # The sandbox first: a seat is never free while its sandbox still runs.
    assert ended_container not in rt.engine.containers and await rt.bound(ended) is None
    assert rt.service.tasks.local(running) is not None
    assert await rt.service.upkeep.free_stale_seats() == 0
