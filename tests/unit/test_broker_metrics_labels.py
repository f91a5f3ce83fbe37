"""FastStream's `handler` label is bounded: a subject that names a task becomes its pattern."""

from __future__ import annotations

import pytest

from shared.broker_metrics import subject_pattern

TASK = "409cb8cef79140aab0f52d8da2821e81"


@pytest.mark.parametrize(
    ("subject", "pattern"),
    [
        (f"deckhands.work.runtime.{TASK}", "deckhands.work.runtime.*"),
        (f"deckhands.events.{TASK}", "deckhands.events.*"),
        (f"deckhands.notices.{TASK}", "deckhands.notices.*"),
        (f"deckhands.routed.runtime.vm.{TASK}", "deckhands.routed.runtime.vm.*"),
        ("_INBOX.abc.def", "_INBOX.*"),
        ("deckhands.storage.history", "deckhands.storage.history"),
    ],
)
def test_a_subject_naming_a_task_is_labelled_by_its_pattern(subject: str, pattern: str) -> None:
    assert subject_pattern(subject) == pattern
    assert TASK not in subject_pattern(subject)
