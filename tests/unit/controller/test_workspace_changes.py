"""Files that change outside the agent's actions (issue 28, item 1): an upload is logged and
its checkpoint asked for at its own seq, the task's actions carry that seq until the log holds
it (the runtime takes it first if its order is late), and a fork or rewind at the upload starts
with the uploaded files, or is refused while they are not kept; a repository's checkout is the
task's files at seq 1."""

from __future__ import annotations

from live_log import TASK, Live, new_task  # type: ignore[import-not-found]

from services.controller.agent_loop.next_hop import execute_order
from shared.commands import CheckpointWorkspace
from shared.events import (
    EventSource,
    WorkspaceCheckpointObservation,
    WorkspaceUploadedObservation,
)
from shared.forks import files_at


def _upload(live: Live) -> int:
    uploaded = WorkspaceUploadedObservation(
        task_id=TASK, source=EventSource.USER, path="docs", files=3, format="tar"
    )
    turn = live.feed(uploaded)
    assert [e.id for e in turn.logged] == [uploaded.id]
    seq = live.seq_of(uploaded.id)
    orders = [m for _, m in turn.sent if isinstance(m, CheckpointWorkspace)]
    assert len(orders) == 1 and (orders[0].seq, orders[0].cause) == (seq, uploaded.id)
    assert orders[0].checkpoint_seq == live.state.checkpoint_seq
    return seq


def _checkpoint_of(live: Live, seq: int, name: str = "", skipped: str = "") -> None:
    live.feed(
        WorkspaceCheckpointObservation(
            task_id=TASK,
            source=EventSource.ENVIRONMENT,
            action_seq=seq,
            checkpoint="" if skipped else name or f"{TASK}/{seq}",
            skipped=skipped,  # type: ignore[arg-type]
            files=4,
            bytes=40,
        )
    )


def test_an_upload_is_logged_and_checkpointed_at_its_own_seq() -> None:
    live = new_task()
    first = live.command("echo 1 > a")
    live.checkpoint(first)
    at = _upload(live)
    assert live.state.checkpoint_due == at
    # The fork or rewind at the upload waits for its checkpoint: refused meanwhile.
    assert files_at(live.log, at).pending == at
    # The next action carries the seq: the runtime takes the upload's checkpoint before it.
    action = live.run("cat docs/x")
    assert execute_order(live.state, action).checkpoint_due == at

    _checkpoint_of(live, at)
    assert live.state.checkpoint_due is None and live.state.checkpoint_seq == at
    files = files_at(live.log, at)
    assert files.checkpoint == f"{TASK}/{at}" and files.pending is None
    # Before the upload: the command's files.
    assert files_at(live.log, at - 1).checkpoint == f"{TASK}/{live.seq_of(first.id)}"


def test_an_upload_that_changed_nothing_names_the_checkpoint_before_it() -> None:
    live = new_task()
    first = live.command("echo 1 > a")
    live.checkpoint(first)
    before = live.seq_of(first.id)
    at = _upload(live)
    _checkpoint_of(live, at, name=f"{TASK}/{before}")
    assert live.state.checkpoint_due is None and live.state.checkpoint_seq == before
    assert files_at(live.log, at).checkpoint == f"{TASK}/{before}"


def test_an_upload_into_a_stopped_sandbox_is_checkpointed_by_the_next_action() -> None:
    live = new_task()
    at = _upload(live)
    _checkpoint_of(live, at, skipped="not_running")
    # Not kept yet: a fork at it is refused with why; the next action still takes it.
    files = files_at(live.log, at)
    assert files.unkept is not None and files.unkept.skipped == "not_running"
    assert live.state.checkpoint_due == at
    _checkpoint_of(live, at)
    assert live.state.checkpoint_due is None
    files = files_at(live.log, at)
    assert files.checkpoint == f"{TASK}/{at}" and files.unkept is None


def test_a_repositorys_checkout_is_the_tasks_files_from_its_creation() -> None:
    live = new_task()
    _checkpoint_of(live, 1)  # taken right after the checkout, before the first action
    assert live.state.checkpoint_seq == 1
    created_turn_end = live.log[-1].seq
    assert created_turn_end is not None
    assert files_at(live.log, 1).checkpoint == f"{TASK}/1"
    first = live.command("touch b")
    assert files_at(live.log, live.output_seq(first)).checkpoint == f"{TASK}/1"
    live.checkpoint(first)
    assert files_at(live.log, live.output_seq(first)).checkpoint == (
        f"{TASK}/{live.seq_of(first.id)}"
    )
