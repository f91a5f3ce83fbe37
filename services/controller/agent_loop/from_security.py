"""The security monitor's verdict on the pending action: denied, held for a person's
confirmation, or ordered run."""

from __future__ import annotations

from shared.egress_policy import EgressPolicy, rules_within
from shared.events import (
    AgentState,
    ErrorObservation,
    EventBase,
    EventSource,
    RiskLevel,
    SecurityVerdictObservation,
    Verdict,
)
from shared.state import ActionScope, Approval, ApprovedBy, Awaiting, TaskState
from shared.subjects import Service

from ..turn import Turn
from .common import SECURITY_DENIED, remember
from .next_hop import execute_order, next_step

__all__ = [
    "from_security",
]

_RISK_ORDER = {RiskLevel.LOW: 0, RiskLevel.MEDIUM: 1, RiskLevel.HIGH: 2}


def _needs_confirmation(state: TaskState, risk: RiskLevel) -> bool:
    if not state.confirmation_mode:
        return False
    if risk is RiskLevel.UNKNOWN:
        return True
    return _RISK_ORDER[risk] >= _RISK_ORDER.get(state.confirmation_threshold, 2)


def _scope(
    state: TaskState, action_id: str, verdict: SecurityVerdictObservation
) -> ActionScope | None:
    """The verdict's network scope within the task's policy, for the action it rules on."""
    if state.network is None or verdict.network_scope is None:
        return None
    asked = EgressPolicy(allow=verdict.network_scope)
    return ActionScope(action_id=action_id, network=rules_within(asked, state.network))


def from_security(turn: Turn, event: EventBase) -> None:
    verdict = turn.log(event)
    action = turn.state.pending_action
    if not isinstance(verdict, SecurityVerdictObservation) or action is None:
        turn.update(awaiting=Awaiting.NOTHING, awaiting_id=None, pending_action=None)
        next_step(turn)
        return
    turn.update(action_scope=_scope(turn.state, action.id, verdict))
    if verdict.verdict is Verdict.DENY:
        remember(
            turn,
            turn.log(
                ErrorObservation(
                    task_id=event.task_id,
                    source=EventSource.ENVIRONMENT,
                    cause=action.id,
                    error_code=SECURITY_DENIED,
                    content=f"The security monitor denied this action ({verdict.rule}): "
                    f"{verdict.reason}. Choose another way.",
                )
            ),
        )
        turn.update(awaiting=Awaiting.NOTHING, awaiting_id=None, pending_action=None)
        next_step(turn)
    elif _needs_confirmation(turn.state, verdict.risk):
        turn.change_state(
            AgentState.AWAITING_USER_CONFIRMATION,
            f"{verdict.risk.value} risk action needs confirmation",
            cause=action.id,
        )
        turn.update(awaiting=Awaiting.CONFIRMATION)
    else:
        turn.update(
            awaiting=Awaiting.RUNTIME,
            approval=Approval(action_id=action.id, by=ApprovedBy.SECURITY, answer_id=verdict.id),
        )
        turn.send(Service.RUNTIME, execute_order(turn.state, action))
