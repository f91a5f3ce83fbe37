"""Checkpoints of /workspace after actions (issue 28, item 1), on the real Docker engine and a
real JetStream object store: only what changed is stored again, the store holds exactly the
files of each checkpoint, a runtime that lost its copy of the base still stores only the change,
a workspace too large is said so (the action unaffected), and a deleted task's checkpoints go."""

from __future__ import annotations

import asyncio
import hashlib
import io
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import docker
import pytest
from nats.js import JetStreamContext
from runtime_helpers import (  # type: ignore[import-not-found]
    cmd,
    eventually,
    make_settings,
    remove_pool_containers,
)

from services.runtime.checkpoint_point import CheckpointPoint
from services.runtime.checkpoint_store import CheckpointMissing, CheckpointStore
from services.runtime.service import RuntimeService
from shared.commands import CheckpointWorkspace, ExecuteAction, ReleaseSandbox
from shared.events import (
    CmdOutputObservation,
    EventBase,
    EventSource,
    FileEditAction,
    WorkspaceCheckpointObservation,
    WorkspaceUploadedObservation,
)
from shared.settings import CommonSettings
from shared.workspace import (
    WorkspaceOp,
    WorkspaceRequest,
    WorkspaceStatus,
    WorkspaceTransfers,
    transfer_name,
)

pytestmark = [pytest.mark.docker, pytest.mark.timeout(300)]


class _Runtime:
    def __init__(self, service: RuntimeService, task_id: str) -> None:
        self.service = service
        self.task_id = task_id
        self.published: list[EventBase] = []
        self.observations: list[EventBase] = []
        self.seq = 0

    async def publish(self, event: EventBase) -> None:
        self.published.append(event)

    async def run(self, action: Any, **order: Any) -> WorkspaceCheckpointObservation | None:
        """Run the action as the log's next entry; its checkpoint, if one was taken."""
        self.seq += 2
        action = action.model_copy(update={"seq": self.seq})
        before = len(self.published)
        observation = await self.service.execution.run(
            ExecuteAction(task_id=self.task_id, action=action, **order), last_try=True
        )
        self.observations.append(observation)
        assert self.service.checkpoints is not None
        await self.service.checkpoints.settle(self.task_id)
        made = [e for e in self.published[before:] if isinstance(e, WorkspaceCheckpointObservation)]
        assert len(made) <= 1, made
        if made:
            assert made[0].cause == action.id and made[0].action_seq == self.seq
        return made[0] if made else None


Start = Callable[..., Awaitable[tuple[RuntimeService, CheckpointStore]]]


@pytest.fixture
async def started(
    isolated_settings: CommonSettings,
    sandbox_image: str,
    docker_client: docker.DockerClient,
    js: JetStreamContext,
) -> AsyncIterator[Start]:
    """Starts a runtime that takes checkpoints, on a pool of its own (its settings as keywords);
    each one started is stopped, and its containers removed, however the test ends."""
    made: list[tuple[RuntimeService, str]] = []

    async def start(**kw: Any) -> tuple[RuntimeService, CheckpointStore]:
        pool = f"test-ckpt-{uuid.uuid4().hex[:6]}"
        store = CheckpointStore(lambda: js)
        config = make_settings(isolated_settings, sandbox_image, pool, **kw)
        service = RuntimeService(config, _ignore, checkpoint_store=store)
        made.append((service, pool))
        await service.start()
        return service, store

    yield start
    for service, pool in made:
        await service.stop()
        remove_pool_containers(docker_client, pool)


async def _ignore(event: EventBase) -> None:
    return None


async def test_each_checkpoint_stores_what_changed_and_holds_exactly_the_files(
    started: Start,
    js: JetStreamContext,
) -> None:
    service, store = await started()
    runtime = _Runtime(service, uuid.uuid4().hex)
    service.publish = runtime.publish
    task_id = runtime.task_id
    # A checkout-sized tree: 300 files of about 1 KiB, hidden ones and a link among them.
    first = await runtime.run(
        cmd(
            task_id,
            "mkdir -p src/pkg && for i in $(seq 1 300); do head -c 1000 /dev/urandom "
            "| base64 > src/pkg/f$i.txt; done; echo secret=1 > .env; "
            "ln -s src/pkg/f1.txt first; mkdir empty",
        )
    )
    assert first is not None and first.skipped == "", first
    assert first.base_seq is None and first.files == 305, first  # 300 + .env, 2 dirs, ...
    assert first.stored_bytes > 300 * 1000

    # A one-file edit: that file (and its folder's entry) stored again, nothing else.
    edit = FileEditAction(
        task_id=task_id,
        source=EventSource.AGENT,
        command="str_replace",
        path="/workspace/.env",
        old_str="secret=1",
        new_str="secret=2",
    )
    second = await runtime.run(edit)
    assert second is not None and second.base_seq == first.action_seq, second
    assert second.changed == 1 and second.stored_bytes < 1000, second

    # A command that changes nothing: no checkpoint (the last one holds the same files).
    assert await runtime.run(cmd(task_id, "ls -la src/pkg | wc -l")) is None

    third = await runtime.run(cmd(task_id, "rm src/pkg/f9.txt; echo more >> src/pkg/f7.txt"))
    assert third is not None and third.changed == 3, third  # f9 gone, f7, and their folder

    # The store holds exactly the files of each checkpoint.
    manifest = await store.manifest(task_id, third.action_seq)
    assert "src/pkg/f9.txt" not in manifest.entries
    assert manifest.entries["first"][0] == "l" and manifest.entries["first"][3] == "src/pkg/f1.txt"
    assert manifest.entries["empty"][0] == "d"
    sandbox = service.tasks.local(task_id)
    assert sandbox is not None
    for path in ("src/pkg/f7.txt", ".env", "src/pkg/f300.txt"):
        inside = await runtime.service.execution.run(
            ExecuteAction(task_id=task_id, action=cmd(task_id, f"cat {path}")), last_try=True
        )
        assert isinstance(inside, CmdOutputObservation)
        stored = await store.get_content(task_id, manifest.entries[path][3])
        assert stored.decode().strip() == inside.content.strip(), path
    earlier = await store.manifest(task_id, second.action_seq)
    assert "src/pkg/f9.txt" in earlier.entries  # an earlier checkpoint keeps its files

    # The runtime lost its copy of the base (a restart): the executor reports every path,
    # compared here with the last checkpoint the log names: still only the change stored.
    assert service.checkpoints is not None
    service.checkpoints.forget(task_id)
    fourth = await runtime.run(cmd(task_id, "echo new > new.txt"), checkpoint_seq=third.action_seq)
    assert fourth is not None and fourth.base_seq == third.action_seq, fourth
    assert fourth.changed == 1 and fourth.stored_bytes < 1000, fourth

    # Its sandbox released: nothing of it stays in the runtime's memory.
    assert task_id in service.checkpoints.remembered()
    await service.seating.release(ReleaseSandbox(task_id=task_id, reason="test"))
    assert task_id not in service.checkpoints.remembered()
    # Deleted with its task.
    assert await service.checkpoints.remove(task_id) > 300
    with pytest.raises(CheckpointMissing):
        await CheckpointStore(lambda: js).manifest(task_id, fourth.action_seq)


async def test_a_workspace_too_large_to_keep_is_said_so_and_the_action_is_unaffected(
    started: Start,
) -> None:
    service, _ = await started(checkpoint_max_workspace_bytes=100_000)
    runtime = _Runtime(service, uuid.uuid4().hex)
    service.publish = runtime.publish
    small = await runtime.run(cmd(runtime.task_id, "head -c 50000 /dev/zero > a.bin"))
    assert small is not None and small.skipped == "", small
    big = await runtime.run(cmd(runtime.task_id, "head -c 80000 /dev/zero > b.bin && echo ok"))
    assert big is not None and big.skipped == "too_large" and big.checkpoint == "", big
    assert "100000 bytes" in big.detail and big.bytes > 100_000
    ran = runtime.observations[-1]
    assert isinstance(ran, CmdOutputObservation), ran
    assert ran.exit_code == 0 and "ok" in ran.content


async def test_a_task_whose_sandbox_was_removed_goes_on_with_its_files_restored(
    started: Start,
    docker_client: docker.DockerClient,
) -> None:
    service, _ = await started()
    runtime = _Runtime(service, uuid.uuid4().hex)
    service.publish = runtime.publish
    task_id = runtime.task_id
    first = await runtime.run(
        cmd(
            task_id,
            "mkdir -p app/.cache && echo one > app/a.txt && chmod 600 app/a.txt "
            "&& ln -s a.txt app/link && head -c 200000 /dev/urandom > app/.cache/blob "
            "&& head -c 400000 /dev/urandom > app/big.bin && md5sum app/big.bin > big.md5",
        )
    )
    second = await runtime.run(cmd(task_id, "echo two > b.txt && rm app/.cache/blob"))
    assert first is not None and second is not None
    sums = await runtime.run(cmd(task_id, "cd app && md5sum a.txt > sums && export X=1"))
    assert sums is not None
    sandbox = service.tasks.local(task_id)
    assert sandbox is not None
    # Its container removed under it (its machine lost), and this replica restarted: only
    # the log's last checkpoint is known.
    docker_client.api.remove_container(sandbox.container_id, force=True)

    async def noticed() -> bool:
        return sandbox.lost

    await eventually(noticed)
    assert service.checkpoints is not None
    service.checkpoints.forget(task_id)
    await runtime.run(
        cmd(
            task_id,
            "echo cwd=$(pwd); cat /workspace/app/a.txt /workspace/b.txt; "
            "stat -c 'mode=%a owner=%u' /workspace/app/a.txt; "
            "echo link=$(readlink /workspace/app/link); ls -A /workspace/app/.cache | wc -l; "
            "cat /workspace/app/sums; echo X=$X; cd /workspace && md5sum -c big.md5",
        ),
        checkpoint_seq=sums.action_seq,
    )
    restored = runtime.observations[-1]
    assert isinstance(restored, CmdOutputObservation), restored
    notice, _, output = restored.content.partition("\n")
    assert f"restored from the checkpoint taken after seq {sums.action_seq}" in notice
    md5 = hashlib.md5(b"one\n").hexdigest()
    assert output.split("\n")[:9] == [
        "cwd=/workspace/app",  # where the last command left the shell
        "one",
        "two",
        "mode=600 owner=1000",
        "link=a.txt",
        "0",  # the folder is there, what was removed from it is not
        f"{md5}  a.txt",
        "X=",  # the shell is new
        "app/big.bin: OK",  # a content of several chunks in the store
    ], restored.content
    assert restored.exit_code == 0
    now = service.tasks.local(task_id)
    assert now is not None and now.container_id != sandbox.container_id


async def test_checkpoints_past_their_retention_are_removed_and_recent_ones_kept(
    started: Start,
    js: JetStreamContext,
) -> None:
    service, store = await started(checkpoint_retention_s=2.0)
    old, recent = _Runtime(service, uuid.uuid4().hex), _Runtime(service, uuid.uuid4().hex)
    service.publish = old.publish
    before = await old.run(cmd(old.task_id, "echo old > a.txt"))
    await asyncio.sleep(2.5)
    service.publish = recent.publish
    kept = await recent.run(cmd(recent.task_id, "echo recent > a.txt"))
    assert before is not None and kept is not None
    assert service.checkpoints is not None
    # The old task's content and manifest (and those of the tests before, as old).
    assert await service.checkpoints.sweep() >= 2
    with pytest.raises(CheckpointMissing):
        await CheckpointStore(lambda: js).manifest(old.task_id, before.action_seq)
    assert "a.txt" in (await store.manifest(recent.task_id, kept.action_seq)).entries


async def test_an_uploads_files_are_checkpointed_at_its_own_entry(
    started: Start,
    js: JetStreamContext,
) -> None:
    service, store = await started()
    service.workspace.transfers = transfers = WorkspaceTransfers(lambda: js)
    runtime = _Runtime(service, uuid.uuid4().hex)
    service.publish = runtime.publish
    task_id = runtime.task_id
    checkpoints = service.checkpoints
    assert checkpoints is not None

    async def upload(path: str, data: bytes) -> WorkspaceUploadedObservation:
        name = transfer_name(task_id)
        await transfers.put(name, io.BytesIO(data))
        request = WorkspaceRequest(
            op=WorkspaceOp.PUT_FILE, task_id=task_id, path=path, upload=name, max_bytes=4096
        )
        reply = await service.workspace.handle(request)
        assert reply.status is WorkspaceStatus.OK, reply
        logged = runtime.published[-1]  # the runtime's entry for the log
        assert isinstance(logged, WorkspaceUploadedObservation), runtime.published
        assert (logged.path, logged.files, logged.format) == (path, 1, "file")
        runtime.seq += 1  # the controller logs it
        return logged.model_copy(update={"seq": runtime.seq})

    def taken(seq: int) -> WorkspaceCheckpointObservation:
        made = [
            e
            for e in runtime.published
            if isinstance(e, WorkspaceCheckpointObservation) and e.action_seq == seq
        ]
        assert len(made) == 1, runtime.published
        return made[0]

    first = await runtime.run(cmd(task_id, "echo one > a.txt"))
    assert first is not None and first.checkpoint, first
    # The controller logged the upload and asks for its checkpoint there.
    up = await upload("docs/up.txt", b"uploaded\n")
    assert up.seq is not None
    order = CheckpointWorkspace(
        task_id=task_id, seq=up.seq, cause=up.id, checkpoint_seq=first.action_seq
    )
    sandbox = service.tasks.local(task_id)
    assert sandbox is not None
    checkpoints.take(CheckpointPoint.after_upload(order), sandbox)
    await checkpoints.settle(task_id)
    at_upload = taken(up.seq)
    assert at_upload.checkpoint == f"{task_id}/{up.seq}" and at_upload.cause == up.id
    assert at_upload.base_seq == first.action_seq and at_upload.changed >= 1, at_upload
    manifest = await store.manifest(task_id, up.seq)
    assert {"a.txt", "docs", "docs/up.txt"} <= set(manifest.entries)
    stored = await store.get_content(task_id, manifest.entries["docs/up.txt"][3])
    assert stored == b"uploaded\n"

    # The same bytes again: nothing changed, the entry names the checkpoint before.
    again = await upload("docs/up.txt", b"uploaded\n")
    assert again.seq is not None
    order = CheckpointWorkspace(task_id=task_id, seq=again.seq, cause=again.id)
    checkpoints.take(CheckpointPoint.after_upload(order), sandbox)
    await checkpoints.settle(task_id)
    assert taken(again.seq).checkpoint == f"{task_id}/{up.seq}"

    # Its order late: the next action carries the upload's seq and takes it first, so the
    # checkpoint holds the upload and not what the action wrote.
    late = await upload("late.txt", b"late\n")
    assert late.seq is not None
    runtime.seq += 2
    action = cmd(task_id, "echo after > after.txt").model_copy(update={"seq": runtime.seq})
    ran = await service.execution.run(
        ExecuteAction(task_id=task_id, action=action, checkpoint_due=late.seq), last_try=True
    )
    assert isinstance(ran, CmdOutputObservation) and ran.exit_code == 0, ran
    await checkpoints.settle(task_id)
    at_late = await store.manifest(task_id, taken(late.seq).action_seq)
    assert "late.txt" in at_late.entries and "after.txt" not in at_late.entries
    after = taken(action.seq)
    assert after.base_seq == late.seq, after
    # The order that comes after it takes nothing again.
    order = CheckpointWorkspace(task_id=task_id, seq=late.seq, cause=late.id)
    checkpoints.take(CheckpointPoint.after_upload(order), sandbox)
    await checkpoints.settle(task_id)
    taken(late.seq)
