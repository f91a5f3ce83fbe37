"""A task's egress policy (issue 27): what a creation asks for, and the policy the task gets.

A task asks for rules of its own (`network.allow`) and the operator's presets by name
(`network.presets`, DECKHANDS_EGRESS_PRESETS); its policy is their union, and must lie within
its bound: its tenant's egress_allow if the operator set one, else the server's
DECKHANDS_EGRESS_ALLOW. `network_egress: true` asks for the whole bound. A task with a policy
reaches the network through the egress proxy only, never on the plain bridge of
`network_egress`: that one is left to a server with no bound that allows egress the old way
(DECKHANDS_ALLOW_NETWORK_EGRESS), for a tenant the operator gave no bound of its own.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from pydantic import Field

from shared.egress_policy import MAX_RULES, EgressPolicy, RuleText, policy_outside

from ..errors import EgressForbidden, EgressPolicyRefused
from ..http.models import ApiRequest
from ..settings import PresetName
from .values import NewTask, TaskDefaults

__all__ = ["MAX_PRESETS", "TaskEgress", "TaskNetwork", "message_egress", "task_egress"]

MAX_PRESETS = 16


class TaskNetwork(ApiRequest):
    """Where the task's sandbox may connect, through the egress proxy: its own rules and the
    operator's presets, together."""

    allow: list[RuleText] = Field(
        default_factory=list,
        max_length=MAX_RULES,
        description="Destinations: `host`, `*.domain`, an IP address, a CIDR network or `*` "
        "(any public host), each with an optional `:port` (`[v6]:port` for IPv6).",
    )
    presets: list[PresetName] = Field(
        default_factory=list,
        max_length=MAX_PRESETS,
        description="Names of the operator's presets (DECKHANDS_EGRESS_PRESETS), each a list of "
        "rules, e.g. `python` for the package index.",
    )
    between_actions: list[RuleText] = Field(
        default_factory=list,
        max_length=MAX_RULES,
        description="What a process the agent left running (a dev server, a watcher) may still "
        "reach between actions, within the rules above. Empty (the default): nothing; "
        "during an action, what the security monitor scoped it to, else the whole policy.",
    )


@dataclass(frozen=True)
class TaskEgress:
    """What a new task gets: its policy (None: no network), or the plain bridge."""

    network: EgressPolicy | None = None
    network_egress: bool = False


def task_egress(
    new: NewTask, defaults: TaskDefaults, bound_rules: tuple[str, ...], tenant_bound: bool
) -> TaskEgress:
    """The egress `new` gets within the bound (`tenant_bound`: the tenant's own, not the
    server's). A policy wider than the bound, an unknown preset: EgressPolicyRefused (422,
    naming it); `network_egress` where no egress is allowed: EgressForbidden (403)."""
    if not (new.network_egress or new.network_allow or new.network_presets):
        if new.network_between_actions:
            raise EgressPolicyRefused(
                "network: between_actions needs rules to lie within (allow, presets or "
                "network_egress)"
            )
        return TaskEgress()  # most tasks: no rule of the bound is parsed for them
    bound = EgressPolicy(allow=bound_rules)
    asked = _asked(new.network_allow, new.network_presets, defaults.egress_presets)
    outside = policy_outside(asked, bound)
    if outside is not None:
        whose = (
            "this tenant may use (its egress_allow, set by the operator)"
            if tenant_bound
            else "this server allows (DECKHANDS_EGRESS_ALLOW)"
        )
        raise EgressPolicyRefused(f"network: the rule {outside!r} is outside what {whose}")
    if not new.network_egress:
        if not asked.allow:
            return TaskEgress()  # no rule at all reaches nowhere: the same as no network
        return TaskEgress(network=with_background(asked, new.network_between_actions))
    if bound.allow:
        return TaskEgress(network=with_background(bound, new.network_between_actions))
    if tenant_bound:
        raise EgressForbidden(
            "network_egress: this tenant may use no egress (its egress_allow is empty); "
            "create the task without it"
        )
    if defaults.network_egress_allowed:
        return TaskEgress(network_egress=True)
    raise EgressForbidden(
        "network_egress is disabled on this server (DECKHANDS_ALLOW_NETWORK_EGRESS=false, "
        "DECKHANDS_EGRESS_ALLOW empty); create the task without it"
    )


def message_egress(
    network: TaskNetwork,
    current: EgressPolicy | None,
    defaults: TaskDefaults,
    bound_rules: tuple[str, ...],
    tenant_bound: bool,
) -> EgressPolicy:
    """What a user's message adds to a task's policy: within the bound as at creation
    (EgressPolicyRefused, 422, naming the rule outside). A task made without a policy has a
    sandbox with no way out at all: it cannot gain one (a new task can)."""
    if current is None:
        raise EgressPolicyRefused(
            "network: this task was created without network access, and its sandbox has no "
            "way out to widen; create a new task with `network`"
        )
    asked = _asked(tuple(network.allow), tuple(network.presets), defaults.egress_presets)
    outside = policy_outside(asked, EgressPolicy(allow=bound_rules))
    if outside is not None:
        whose = "its tenant's egress_allow" if tenant_bound else "DECKHANDS_EGRESS_ALLOW"
        raise EgressPolicyRefused(f"network: the rule {outside!r} is outside {whose}")
    return with_background(asked, tuple(network.between_actions), within=current)


def with_background(
    policy: EgressPolicy, rules: tuple[str, ...], within: EgressPolicy | None = None
) -> EgressPolicy:
    """`policy` with `rules` as what holds between actions; a rule outside the policy (and
    `within`, the task's policy a message widens): EgressPolicyRefused (422, naming it)."""
    if not rules:
        return policy
    scope = policy if within is None else policy.union(within)
    outside = policy_outside(EgressPolicy(allow=rules), scope)
    if outside is not None:
        raise EgressPolicyRefused(
            f"network: between_actions: the rule {outside!r} is not within the task's "
            "policy (allow, presets)"
        )
    # A message's rules between actions may name what the task had already: they join its
    # addition too (within the task's policy, so nothing wider), which keeps it one policy.
    extra = () if within is None else tuple(r for r in rules if r not in policy.allow)
    return EgressPolicy(allow=policy.allow + extra, between_actions=rules)


def _asked(
    allow: tuple[str, ...], preset_names: tuple[str, ...], presets: Mapping[str, EgressPolicy]
) -> EgressPolicy:
    """Rules and the named presets', in one policy."""
    rules = dict.fromkeys(allow)
    for name in preset_names:
        preset = presets.get(name)
        if preset is None:
            known = ", ".join(sorted(presets)) or "none"
            raise EgressPolicyRefused(
                f"network: unknown preset {name!r} (this server's presets: {known})"
            )
        rules.update(dict.fromkeys(preset.allow))
    if len(rules) > MAX_RULES:
        raise EgressPolicyRefused(
            f"network: {len(rules)} rules with the presets', more than {MAX_RULES}"
        )
    return EgressPolicy(allow=tuple(rules))
