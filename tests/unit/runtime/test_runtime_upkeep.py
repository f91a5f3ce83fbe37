"""The runtime's upkeep (services/runtime/upkeep.py, reconcile.py) on the fake engine and a
real Redis: a waiting task's idle sandbox is stopped and started again with its files,
reconciliation removes what nobody holds and binds again what Redis lost, a restarted process
adopts its task sandboxes, and a Redis that lost the runtime's records gets them back. The
Docker tests of the same: tests/integration/runtime/test_runtime_recovery.py."""

from __future__ import annotations

import asyncio

from services.runtime.containers import task_container_name
from shared.admission import seats_prefix
from shared.events import (
    AgentState,
    CmdOutputObservation,
    EventSource,
    FileReadAction,
    FileReadObservation,
    FileWriteAction,
)
from tests.fakes.runtime import FakeRuntime, RuntimeHarness


async def _write(rt: RuntimeHarness, task_id: str, path: str, content: str) -> None:
    action = FileWriteAction(task_id=task_id, source=EventSource.AGENT, path=path, content=content)
    await rt.service.execution.execute(await rt.order(action))


async def _read(rt: RuntimeHarness, task_id: str, path: str) -> str:
    action = FileReadAction(task_id=task_id, source=EventSource.AGENT, path=path)
    await rt.service.execution.execute(await rt.order(action))
    answer = rt.published[-1]
    assert isinstance(answer, FileReadObservation), answer
    return answer.content


async def test_a_waiting_tasks_idle_sandbox_is_stopped_and_started_again_with_its_files(
    fake_runtime: FakeRuntime,
) -> None:
    rt = fake_runtime(sandbox_idle_stop_s=0.2)
    waiting, running = await rt.task(), await rt.task()
    for task_id in (waiting, running):
        await _write(rt, task_id, "notes.txt", "kept\n")
    container = rt.container_of(waiting)
    await rt.set_state(waiting, AgentState.AWAITING_USER_INPUT)
    await asyncio.sleep(0.3)

    assert await rt.service.upkeep.stop_idle_sandboxes() == 1  # the RUNNING task's stays
    assert rt.engine.ops("keep_workspace") == rt.engine.ops("stop") == [container.id]
    assert container.status == "exited" and await rt.bound(waiting) == container.id
    assert await rt.seated() == {running}  # its seat went to the queue
    assert (await rt.service.upkeep.reconcile()).removed == 0  # stopped on purpose: not dead

    # The user answers: the task's next action starts it again, and is told of the new shell.
    woken = await rt.run(waiting, "cat notes.txt")
    assert isinstance(woken, CmdOutputObservation)
    assert woken.content.startswith("[The sandbox was stopped while the task waited")
    assert woken.content.endswith("ran: cat notes.txt\n")
    assert rt.engine.ops("start") == rt.engine.ops("release_workspace") == [container.id]
    assert container.status == "running" and rt.container_of(waiting) is container
    assert await _read(rt, waiting, "notes.txt") == "kept\n"
    again = await rt.run(waiting, "ls")
    assert isinstance(again, CmdOutputObservation) and again.content == "ran: ls\n"  # told once
    assert await rt.service.bindings.stopped_at(container.id) is None
    assert await rt.seated() == {waiting, running}


async def test_reconciliation_removes_what_nobody_holds_and_binds_again_what_redis_lost(
    fake_runtime: FakeRuntime,
) -> None:
    rt = fake_runtime()
    engine, service = rt.engine, rt.service
    await service.bindings.heartbeat("sibling-process", 30)  # another process, alive
    gone_warm = engine.place("gone-process")  # left by a process that died
    sibling_warm = engine.place("sibling-process")  # its own: left alone
    leaked = engine.place(service.replica_id)  # ours, yet the pool knows nothing of it

    live, ended = await rt.task(), await rt.task()
    for task_id in (live, ended):
        await rt.run(task_id, "echo hi")
        await service.tasks.renamed(task_id)
    live_id, ended_id = rt.container_of(live).id, rt.container_of(ended).id
    for task_id, container_id in ((live, live_id), (ended, ended_id)):
        service.tasks.forget_local(task_id)  # as after a restart: tracked by nobody
        service.pool.forget(container_id)
    await service.bindings.unbind(live, live_id)  # Redis lost the live task's binding
    await rt.set_state(ended, AgentState.FINISHED)

    report = await service.upkeep.reconcile()
    assert (report.removed, report.rebound, report.unbound) == (3, 1, 1)
    assert set(engine.ops("remove")) == {gone_warm.id, leaked.id, ended_id}
    assert sibling_warm.id in engine.containers and live_id in engine.containers
    assert await rt.bound(live) == live_id  # found by its name: deckhands-task-<task>
    assert engine.containers[live_id].name == task_container_name(live)
    assert await rt.bound(ended) is None
    assert (await service.upkeep.reconcile()).removed == 0  # nothing left to do


async def test_a_restarted_process_adopts_its_task_sandboxes_at_start(
    fake_runtime: FakeRuntime,
) -> None:
    first = fake_runtime()
    task_id = await first.task()
    await _write(first, task_id, "state.txt", "kept\n")
    container = first.container_of(task_id)
    await first.service.tasks.renamed(task_id)
    await first.close()  # the task's sandbox stays for a successor
    assert container.id in first.engine.containers and container.status == "running"

    second = first.another_process()
    await second.service.start()  # reconciles: adopts the sandbox its replica holds
    adopted = second.service.tasks.local(task_id)
    assert adopted is not None and adopted.container_id == container.id
    assert second.engine.ops("attach") == [container.id]
    assert await _read(second, task_id, "state.txt") == "kept\n"
    assert second.engine.ops("create") == []  # no fresh sandbox: the same workspace
    assert task_id in await second.seated()


async def test_after_redis_lost_the_runtimes_records_its_sandboxes_are_bound_again(
    fake_runtime: FakeRuntime,
) -> None:
    rt = fake_runtime()
    service = rt.service
    task_id = await rt.task()
    await rt.run(task_id, "echo hi")
    container_id = rt.container_of(task_id).id
    await service.bindings.marker(service.replica_id).mark()
    assert await service.upkeep.readopt_after_redis_loss() == 0  # nothing lost

    # Redis loses every record of this pool (a FLUSHALL scoped to the test's own keys).
    pool = rt.settings.pool_name
    for pattern in (f"deckhands:runtime:{pool}:*", f"{seats_prefix(pool)}*"):
        async for key in service.redis.scan_iter(match=pattern):
            await service.redis.delete(key)
    assert await rt.bound(task_id) is None and await rt.seated() == set()

    assert await service.upkeep.readopt_after_redis_loss() == 1
    assert await service.bindings.held(task_id) == (container_id, service.replica)
    assert await rt.seated() == {task_id}  # new tasks get only the seats that are left
    assert await service.bindings.replica_alive(service.replica_id)
    assert await service.upkeep.readopt_after_redis_loss() == 0  # marked intact again
