"""A tenant's limits: what the operator set (TenantLimits), the server's defaults (QuotaDefaults),
and those in force (Quotas)."""

from __future__ import annotations

from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict, Field

from shared.egress_policy import MAX_RULES, EgressPolicy, RuleText, rules_within

__all__ = ["QuotaDefaults", "Quotas", "TenantLimits"]


class TenantLimits(BaseModel):
    """What the operator set for one tenant; each field left out (null) is the server default."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    max_running_tasks: int | None = Field(
        default=None, ge=0, le=100_000, description="Tasks running at once (0: none)."
    )
    max_sandboxes: int | None = Field(
        default=None, ge=0, le=100_000, description="Sandboxes the tenant's tasks hold at once."
    )
    max_spend_usd_per_day: float | None = Field(
        default=None, ge=0, le=1_000_000, description="LLM spend per UTC day, in USD."
    )
    default_max_budget_usd: float | None = Field(
        default=None, gt=0, le=10_000, description="Budget of a task that names none."
    )
    max_egress_bytes_per_day: int | None = Field(
        default=None,
        ge=0,
        le=10**15,
        description="Bytes the tenant's sandboxes may move through the egress proxy per UTC "
        "day, both ways (0: none).",
    )
    max_delegation_depth: int | None = Field(
        default=None, ge=0, le=16, description="How deep sub-tasks may nest (0: no delegation)."
    )
    max_sub_tasks: int | None = Field(
        default=None, ge=0, le=1000, description="Sub-tasks one task may delegate."
    )
    max_event_streams: int | None = Field(
        default=None, ge=1, le=100_000, description="Event streams (SSE) open at once."
    )
    allow_trajectory_tasks: bool | None = Field(
        default=None,
        description="Whether the tenant may create a task from a trajectory (replay): its "
        "recorded actions are reviewed like any other, but it steers the agent without an LLM.",
    )
    seat_weight: float | None = Field(
        default=None,
        gt=0,
        le=1000,
        description="The tenant's share of the sandbox seats while tenants queue for them: "
        "seats go to the tenant furthest below weight / (sum of the weights of the tenants "
        "holding or wanting seats). 1 by default; a tenant alone uses every seat whatever it is.",
    )
    egress_allow: tuple[RuleText, ...] | None = Field(
        default=None,
        max_length=MAX_RULES,
        description="Where the tenant's tasks may connect at most (egress rules: `host`, "
        "`*.domain`, an address, a CIDR network or `*`, each with an optional `:port`), within "
        "the server's DECKHANDS_EGRESS_ALLOW; a task asks for its own policy within it. Empty: "
        "no egress for this tenant.",
    )


@dataclass(frozen=True)
class QuotaDefaults:
    """The server's defaults (GatewaySettings): what a tenant gets unless the operator says."""

    max_running_tasks: int = 1000
    max_sandboxes: int = 1000
    max_spend_usd_per_day: float | None = None
    default_max_budget_usd: float | None = 10.0
    max_egress_bytes_per_day: int | None = None
    max_delegation_depth: int = 3
    max_sub_tasks: int = 10
    max_event_streams: int = 64
    allow_trajectory_tasks: bool = False
    seat_weight: float = 1.0
    egress_allow: tuple[str, ...] = ()  # the server's bound (DECKHANDS_EGRESS_ALLOW)


class Quotas(BaseModel):
    """A tenant's limits in force: its own where the operator set them, else the defaults."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    max_running_tasks: int
    max_sandboxes: int
    max_spend_usd_per_day: float | None
    default_max_budget_usd: float | None
    max_egress_bytes_per_day: int | None = None
    max_delegation_depth: int
    max_sub_tasks: int
    max_event_streams: int
    allow_trajectory_tasks: bool
    seat_weight: float
    # Rules validated where they came from (the settings, TenantLimits): not parsed again
    # with every task created.
    egress_allow: tuple[str, ...] = Field(
        description="Where the tenant's tasks may connect at most: the bound of a task's "
        "egress policy (`network`)."
    )

    @classmethod
    def of(cls, limits: TenantLimits, defaults: QuotaDefaults) -> Quotas:
        own = limits.model_dump(exclude_none=True)
        if limits.egress_allow is not None:
            # Within the server's bound as it is now: a rule the operator has taken out of
            # DECKHANDS_EGRESS_ALLOW since the tenant's was set no longer counts.
            server = EgressPolicy(allow=defaults.egress_allow)
            own["egress_allow"] = rules_within(
                EgressPolicy(allow=limits.egress_allow), server
            ).allow
        return cls(**{**defaults.__dict__, **own})
