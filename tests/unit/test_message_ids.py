"""A message id is sent as the Nats-Msg-Id header: one copied from a malformed message can be
enormous, and sent it would take the message past max_payload (the server then closes the
connection). Found by tests/e2e/test_e2e_poison_messages.py."""

from __future__ import annotations

import json
from types import SimpleNamespace
from typing import Any

import pytest

from shared.delivery import missing_answer_notice
from shared.publishing import MAX_MSG_ID_BYTES, MessageTooLarge, publish_json


class NeverPublishes:
    connection = SimpleNamespace(max_payload=1024 * 1024)

    async def publish(self, *args: Any, **kwargs: Any) -> None:
        raise AssertionError("nothing may be sent")


async def test_an_oversized_message_id_is_refused_before_sending() -> None:
    with pytest.raises(MessageTooLarge, match="Nats-Msg-Id"):
        await publish_json(
            NeverPublishes(),  # type: ignore[arg-type]
            "deckhands.work.controller.t",
            "{}",
            "x" * (MAX_MSG_ID_BYTES + 1),
            "DECKHANDS_WORK",
        )


def test_no_notice_names_an_order_id_no_task_can_await() -> None:
    huge = json.dumps({"id": "i" * 300_000}).encode()
    assert missing_answer_notice("deckhands.work.reasoner.t1", huge, "bad") is None
    normal = json.dumps({"id": "step-1"}).encode()
    notice = missing_answer_notice("deckhands.work.reasoner.t1", normal, "bad")
    assert notice is not None and notice.cause == "step-1"
