"""What the controller's integration tests make: a task in Redis, and a user's message."""

from __future__ import annotations

import uuid

from shared.events import EventSource, MessageAction
from shared.state import TaskState
from shared.state_store import TaskStateStore


async def new_task(store: TaskStateStore, task: str, max_iterations: int) -> str:
    """A fresh task's first State, saved as the controller would find it; its id."""
    task_id = uuid.uuid4().hex
    assert await store.create(TaskState(task_id=task_id, task=task, max_iterations=max_iterations))
    return task_id


def user_message(task_id: str, text: str) -> MessageAction:
    return MessageAction(task_id=task_id, source=EventSource.USER, content=text)
