"""A review before finishing (issue 29): the model's first finish since the user last spoke is
answered with the task and its final message; the next finish ends the task."""

from __future__ import annotations

from services.reasoner.finish_review import finish_review
from services.reasoner.prompt import FINISH_REVIEW, build_messages
from services.reasoner.replies import LLMReply, reply_event, step_event_id
from shared.commands import StepRequest
from shared.events import AgentFinishAction, ErrorObservation, EventSource, LLMUsage, MessageAction

USAGE = LLMUsage(model="openai/scripted", prompt_tokens=10, completion_tokens=5)
TASK = MessageAction(
    task_id="t1", source=EventSource.USER, seq=1, content='Replace "Acme Corp" in docs/.'
)
FINISH = '{"tool": "finish", "arguments": {"message": "Files updated successfully."}}'


def _finish(n: int) -> AgentFinishAction:
    step = StepRequest(task_id="t1", after_seq=n, iteration=n)
    event = reply_event(step, LLMReply(content=FINISH, usage=USAGE), native=False)
    assert isinstance(event, AgentFinishAction)
    return event


def test_the_first_finish_is_answered_with_the_task_and_the_second_ends_it() -> None:
    step = StepRequest(task_id="t1", after_seq=4, iteration=4)
    review = finish_review(step, _finish(4), [TASK], step_event_id(step))
    assert isinstance(review, ErrorObservation) and review.error_code == FINISH_REVIEW
    assert review.id == step_event_id(step) and review.llm_usage == USAGE
    assert 'The task was:\nReplace "Acme Corp" in docs/.\n' in review.content
    assert "You were about to finish with: Files updated successfully." in review.content
    # The model sees it as the user's words, after which it replies.
    messages = build_messages([TASK, review.model_copy(update={"seq": 5})], native=False)
    assert messages[-1] == {"role": "user", "content": review.content}

    logged = [TASK, review.model_copy(update={"seq": 5})]
    assert finish_review(step, _finish(6), logged, "x") is None  # reviewed once: it ends
    said = MessageAction(task_id="t1", source=EventSource.USER, seq=7, content="also README")
    assert finish_review(step, _finish(8), [*logged, said], "y") is not None  # asked anew
    not_a_finish = MessageAction(task_id="t1", source=EventSource.AGENT, content="Which file?")
    assert finish_review(step, not_a_finish, [TASK], "z") is None
