"""One turn of the controller: the State it started from, what it logs, and what it sends.

A turn is built in memory, saved as one State version, and only then published: the saved
outbox lets a redelivered input republish exactly what the first attempt decided.
"""

from __future__ import annotations

from typing import Any

from shared.commands import (
    CheckpointWorkspace,
    ExecuteAction,
    PrepareSandbox,
    ReleaseSandbox,
    ReviewAction,
    StepRequest,
)
from shared.events import (
    SANDBOX_ENDING_STATES,
    AgentDelegateObservation,
    AgentState,
    AgentStateChangedObservation,
    EventBase,
    EventSource,
    SubTaskSpend,
    can_transition,
)
from shared.state import Outgoing, TaskState
from shared.subjects import (
    EVENTS_STREAM,
    NOTICES_STREAM,
    ROUTED_STREAM,
    WORK_STREAM,
    Service,
    event_subject,
    notice_subject,
    routed_subject,
    work_subject,
)

from .errors import IllegalTransition
from .stuck import LoopPolicy

__all__ = ["UNSEEN_MAX_BYTES", "Turn"]

# Log entries a step request carries at most (their JSON): well below NATS' max_payload, and
# what the State keeps between turns. Past it the reasoner reads storage, as before.
UNSEEN_MAX_BYTES = 256 * 1024

Command = (
    StepRequest
    | ReviewAction
    | ExecuteAction
    | PrepareSandbox
    | ReleaseSandbox
    | CheckpointWorkspace
)
# What a turn may send: a work order, or an event into some task's controller inbox.
Message = Command | EventBase


class Turn:
    def __init__(
        self,
        state: TaskState,
        answer_retries: int = 2,
        replaying: bool = False,
        loop: LoopPolicy | None = None,
    ) -> None:
        self.state = state
        self.answer_retries = answer_retries
        self.loop = loop or LoopPolicy()
        self.replaying = replaying  # a rebuild replaying the log: decided, sent, counted before
        self.logged: list[EventBase] = []
        self._payloads: dict[str, str] = {}  # each logged entry's JSON, encoded once
        self.sent: list[tuple[Service, Message]] = []
        self.new_tasks: list[TaskState] = []

    def update(self, **fields: Any) -> None:
        self.state = self.state.model_copy(update=fields)

    def log(self, event: EventBase) -> EventBase:
        """Append `event` to the task's log with the next seq."""
        seq = self.state.last_seq + 1
        stamped = event.model_copy(update={"seq": seq})
        self.update(last_seq=seq)
        self.logged.append(stamped)
        self._payloads[stamped.id] = payload = stamped.model_dump_json()
        self._keep_unseen(stamped, len(payload))
        return stamped

    def inherit(self, entries: list[EventBase]) -> None:
        """Open a fork's log with its parent's entries (already copied and stamped): logged
        as they are, not as the fork's news (no notices, and the reasoner reads them from
        storage, not from the step request)."""
        self.logged += entries
        self.update(unseen_events=None, unseen_bytes=0)

    def _keep_unseen(self, event: EventBase, size: int) -> None:
        """Remember the entry for the next step request, while the entries stay small."""
        unseen = self.state.unseen_events
        if unseen is None:
            return
        total = self.state.unseen_bytes + size
        if total > UNSEEN_MAX_BYTES:
            self.update(unseen_events=None, unseen_bytes=0)
            return
        self.update(unseen_events=[*unseen, event.model_dump(mode="json")], unseen_bytes=total)

    def send(self, service: Service, message: Message) -> None:
        if isinstance(message, StepRequest):
            message = self._with_unseen(message)
        self.sent.append((service, message))

    def _with_unseen(self, step: StepRequest) -> StepRequest:
        """The step carries the entries logged since the last one; then they count as seen.
        Too many to carry (None): none, and the reasoner reads storage, from then on."""
        unseen = self.state.unseen_events
        carried = [e for e in unseen or [] if int(e.get("seq") or 0) <= step.after_seq]
        later = [e for e in unseen or [] if int(e.get("seq") or 0) > step.after_seq]
        self.update(
            unseen_events=later,
            unseen_bytes=self.state.unseen_bytes if later else 0,
        )
        return step.model_copy(update={"events": carried}) if carried else step

    def change_state(self, target: AgentState, reason: str = "", cause: str | None = None) -> None:
        current = self.state.agent_state
        if current == target:
            return
        if not can_transition(current, target):
            raise IllegalTransition(current, target)
        entry = self.log(
            AgentStateChangedObservation(
                task_id=self.state.task_id,
                source=EventSource.ENVIRONMENT,
                cause=cause,
                agent_state=target,
                previous_state=current,
                reason=reason,
            )
        )
        finished = target in SANDBOX_ENDING_STATES or target is AgentState.ERROR
        # When the log says it ended, so that a State rebuilt from the log says the same.
        ended_at = entry.timestamp if finished else None
        self.update(agent_state=target, reason=reason, finished_at=ended_at)
        if target in SANDBOX_ENDING_STATES:
            self.send(
                Service.RUNTIME, ReleaseSandbox(task_id=self.state.task_id, reason=target.value)
            )
        if finished and self.state.parent_task_id and self.state.parent_action_id:
            self.report_to_parent(target, reason)

    def report_to_parent(self, target: AgentState, reason: str) -> None:
        """Hand the sub-task's outcome to the parent's waiting delegate action."""
        state = self.state
        result = state.result
        assert state.parent_task_id is not None
        usage = state.total_usage()
        self.send(
            Service.CONTROLLER,
            AgentDelegateObservation(
                task_id=state.parent_task_id,
                source=EventSource.ENVIRONMENT,
                cause=state.parent_action_id,
                sub_task_id=state.task_id,
                agent_state=target,
                content=result.final_message if result else reason,
                outputs=result.outputs if result else {},
                # Cumulative: the parent keeps the latest report, so its spend adds up to the
                # root's however often a sub-task reports.
                spent=SubTaskSpend(
                    iterations=state.iterations_used(),
                    prompt_tokens=usage.prompt_tokens,
                    completion_tokens=usage.completion_tokens,
                    cost_usd=usage.cost_usd,
                    llm_calls=usage.llm_calls,
                ),
            ),
        )

    def outbox(self) -> list[Outgoing]:
        """Log entries, then orders. Each subject keeps this order when published; subjects go
        out side by side, and a service reading history waits for storage to catch up. Each
        state change also goes to the task's notices (webhooks), as logged."""
        task = self.state.task_id
        out: list[Outgoing] = [
            Outgoing(
                subject=event_subject(task),
                stream=EVENTS_STREAM,
                payload=self._payloads.get(e.id) or e.model_dump_json(),
                msg_id=e.id,
            )
            for e in self.logged
        ]
        out += [
            Outgoing(
                subject=notice_subject(task),
                stream=NOTICES_STREAM,
                payload=self._payloads.get(e.id) or e.model_dump_json(),
                msg_id=e.id,  # deduplicated per stream: the log's own id is this copy's too
            )
            for e in self.logged
            if isinstance(e, AgentStateChangedObservation) and e.inherited_from is None
        ]
        out += [
            Outgoing(
                subject=subject,
                stream=stream,
                payload=m.model_dump_json(),
                msg_id=m.id,
            )
            for service, m in self.sent
            for subject, stream in (self._destination(service, m.task_id),)
        ]
        return out

    def _destination(self, service: Service, task_id: str) -> tuple[str, str]:
        """Where an order goes: a runtime order of a task whose sandbox a known replica holds
        goes to that replica's queue (its sandbox lives on that replica's engine), any other
        to the service's shared queue. A replica that is gone has its queue passed back to the
        shared one by the others (services/runtime/routing.py)."""
        replica = self.state.runtime_replica
        if service is Service.RUNTIME and replica and task_id == self.state.task_id:
            return routed_subject(service, replica, task_id), ROUTED_STREAM
        return work_subject(service, task_id), WORK_STREAM
