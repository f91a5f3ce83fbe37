"""The gateway's settings: DECKHANDS_* environment variables on top of the common ones."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field, SecretStr, StringConstraints, field_validator, model_validator

from shared.egress_policy import MAX_RULES, EgressPolicy, RuleText, policy_outside
from shared.events import RiskLevel
from shared.settings import CommonSettings

__all__ = ["PRESET_NAME_PATTERN", "GatewaySettings", "PresetName"]

PRESET_NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$"
PresetName = Annotated[str, StringConstraints(pattern=PRESET_NAME_PATTERN)]
_PresetRules = Annotated[list[RuleText], Field(max_length=MAX_RULES)]


class GatewaySettings(CommonSettings):
    host: str = Field(default="127.0.0.1", description="Address uvicorn binds (DECKHANDS_HOST).")
    port: int = Field(default=8000, ge=1, le=65535, description="HTTP port (DECKHANDS_PORT).")
    reuse_port: bool = Field(
        default=False,
        description="Bind the port with SO_REUSEPORT, so that several gateway processes on one "
        "host serve it together (the kernel spreads the connections between them); `make up` "
        "runs two, as deploy/k8s/base runs two replicas. Each process counts its own "
        "/metrics, and a scrape of the shared port reaches one of them.",
    )

    default_max_iterations: int = Field(
        default=30, ge=1, le=1000, description="Iteration limit of a task that names none."
    )
    default_max_budget_usd: float | None = Field(
        default=10.0,
        gt=0,
        description="Budget (USD) of a task that names none; a tenant's limits may set its own. "
        "Empty: no budget (then, under a daily spend limit, what is left of the day's).",
    )
    default_confirmation_mode: bool = Field(
        default=False, description="Whether risky actions wait for the user's approval."
    )
    default_confirmation_threshold: RiskLevel = Field(
        default=RiskLevel.HIGH, description="Lowest risk that needs approval in that mode."
    )
    allow_network_egress: bool = Field(
        default=False,
        description="Whether a task may ask for a sandbox with network access "
        "(`network_egress`) on the plain network, where egress_allow is empty (with a bound, "
        "`network_egress` asks for the bound as the task's egress policy instead); false (the "
        "default) refuses such tasks with 403. Same variable as the runtime's.",
    )
    # A task's egress policy (issue 27): services/gateway/tasks/egress.py.
    egress_allow: list[RuleText] = Field(
        default=[],
        max_length=MAX_RULES,
        description="Where tasks' sandboxes may connect at most, through the egress proxy (JSON "
        "list of rules: `host`, `*.domain`, an address, a CIDR network, `*` for any public "
        "host, each with an optional `:port`): the bound of every task's policy (`network`), "
        "which a tenant's egress_allow may narrow. Empty: no task may have a policy.",
    )
    egress_presets: dict[PresetName, _PresetRules] = Field(
        default={},
        description="Named policies a task may ask for by name (`network.presets`), as a JSON "
        'object, e.g. {"python": ["pypi.org", "files.pythonhosted.org"]}; each within '
        "egress_allow.",
    )
    max_workspace_mib: int = Field(
        default=8192,
        ge=1,
        description="The largest /workspace quota a task may ask for (`workspace_mib`), in MiB; "
        "keep it within the runtime's DECKHANDS_SANDBOX_WORKSPACE_MAX_SIZE.",
    )
    # A task's workspace in and out, its repository (workspace/, routes/workspace.py).
    workspace_max_upload_bytes: int = Field(
        default=256 << 20,
        ge=1,
        description="PUT /v1/tasks/{id}/workspace: the most bytes an upload's body may hold "
        "(spooled to a temporary file, never held in memory).",
    )
    workspace_upload_timeout_s: float = Field(
        default=600.0,
        gt=0,
        description="An upload's body must arrive in full within this long (other requests: "
        "DECKHANDS_REQUEST_TIMEOUT_S).",
    )
    workspace_max_download_bytes: int = Field(
        default=1 << 30,
        ge=1,
        description="GET .../workspace (the tar.gz, one file) and .../workspace/diff: the most "
        "bytes an answer may hold; past it, 413.",
    )
    workspace_timeout_s: float = Field(
        default=300.0,
        gt=0,
        description="How long the gateway waits for the runtime's answer to a workspace request.",
    )
    repository_allowed_hosts: list[str] = Field(
        default=[],
        description="Host names (or addresses) a task's repository may name although the "
        "address policy refuses them (JSON list); same variable as the runtime's.",
    )
    repository_url_schemes: list[str] = Field(
        default=["https", "http", "git"],
        description="URL schemes a task's repository may use (JSON list); same variable as the "
        "runtime's.",
    )
    # Each tenant's quotas, unless the operator sets the tenant's own (services.gateway.quotas).
    # A fairness limit per tenant, above the pool's size (DECKHANDS_MAX_SANDBOXES, 100) by
    # default: past the pool, tasks queue first come, first served (the global admission); the
    # quota only keeps one tenant from taking every place in that queue.
    tenant_max_running_tasks: int = Field(
        default=1000, ge=0, description="Tasks one tenant may have running at once; more: 429."
    )
    tenant_max_sandboxes: int = Field(
        default=1000,
        ge=0,
        description="Sandboxes one tenant's tasks (sub-tasks included) may hold before its new "
        "tasks are refused with 429.",
    )
    tenant_max_spend_usd_per_day: float | None = Field(
        default=None,
        ge=0,
        description="LLM spend (USD) per tenant per UTC day, running tasks' budgets reserved; "
        "empty: no daily limit.",
    )
    tenant_max_egress_bytes_per_day: int | None = Field(
        default=None,
        ge=0,
        description="Bytes a tenant's sandboxes may move through the egress proxy per UTC day "
        "(both ways); empty: no daily limit.",
    )
    max_delegation_depth: int = Field(
        default=3, ge=0, le=16, description="How deep sub-tasks may nest (0: no delegation)."
    )
    max_sub_tasks_per_task: int = Field(
        default=10, ge=0, le=1000, description="Sub-tasks one task may delegate over its life."
    )
    max_api_keys_per_tenant: int = Field(
        default=20,
        ge=1,
        le=1000,
        description="Working (unrevoked) API keys one tenant may hold; another is refused "
        "(409) until one is revoked.",
    )
    max_event_streams_per_tenant: int = Field(
        default=64,
        ge=1,
        description="Event streams (SSE) one tenant may hold open on one gateway; more get 429.",
    )
    allow_trajectory_tasks: bool = Field(
        default=False,
        description="Whether every tenant may create a task from a trajectory (replay); else "
        "only the tenants the operator allows it (their limits' allow_trajectory_tasks).",
    )
    trusted_hosts: list[str] = Field(
        default=["127.0.0.1", "localhost", "::1"],
        description="Host header values the gateway answers (a JSON list; `*.example.com` "
        "matches subdomains, `*` any): others get 400, so that a web page cannot drive a local "
        "gateway through DNS rebinding. The probes and /metrics answer any host.",
    )
    history_timeout_s: float = Field(
        default=5.0, gt=0, description="How long to wait for the storage service's answer."
    )
    history_page_size: int = Field(
        default=500, ge=1, le=10_000, description="Events asked of storage per request."
    )
    max_creations_in_flight: int = Field(
        default=128,
        ge=1,
        description="Task creations (POST /v1/tasks) one gateway handles at once; one more waits "
        "up to creation_wait_s for a place, then is answered 503 with Retry-After. Creating a "
        "task is a few writes, so this bounds a burst's memory and latency, not throughput.",
    )
    creation_wait_s: float = Field(
        default=1.0,
        ge=0,
        description="How long a task creation beyond max_creations_in_flight waits for a place "
        "before its 503.",
    )
    idempotency_ttl_s: int = Field(
        default=86_400, ge=1, description="How long an Idempotency-Key stays bound to its task."
    )
    sse_heartbeat_s: float = Field(
        default=15.0, gt=0, description="Comment sent on an idle event stream to keep it open."
    )
    sse_gap_retry_s: float = Field(
        default=0.5, gt=0, description="Delay between attempts to fetch missing events."
    )
    max_request_body_bytes: int = Field(
        default=4 * 1024 * 1024,
        ge=1024,
        description="Largest request body; a larger one is answered 413 without being read. "
        "4 MiB fits the largest legitimate request: a 200,000-character task however its JSON "
        "escapes it (12 bytes a character at worst), or a replayed trajectory of a few MB.",
    )
    max_request_header_bytes: int = Field(
        default=16 * 1024,
        ge=1024,
        description="Request line and headers together; more is answered 431.",
    )
    request_timeout_s: float = Field(
        default=30.0,
        gt=0,
        description="A request (headers and body) not received in full this long after its "
        "first byte, or after its connection opened, is answered 408 and its connection closed.",
    )
    keep_alive_timeout_s: int = Field(
        default=5, ge=1, description="An idle keep-alive connection is closed after this."
    )
    max_event_streams_per_client: int = Field(
        default=16,
        ge=1,
        description="Event streams (SSE) one client address may hold open; more get 429.",
    )
    readiness_timeout_s: float = Field(
        default=2.0, gt=0, description="Time each /readyz check may take."
    )
    delete_stop_timeout_s: float = Field(
        default=30.0,
        gt=0,
        description="How long DELETE /v1/tasks/{id} waits for a running task to stop before it "
        "gives up (503, nothing removed).",
    )
    # Webhooks (issue 11): services/gateway/webhooks/.
    webhook_allow_private_targets: bool = Field(
        default=False,
        description="Let webhooks go to loopback, private and link-local addresses (refused by "
        "default: a tenant must not reach the operator's own network through them).",
    )
    webhook_timeout_s: float = Field(
        default=10.0, gt=0, le=50, description="How long one webhook POST may take."
    )
    webhook_backoff_s: float = Field(
        default=2.0, gt=0, description="Delay before a failed webhook's second attempt; doubles."
    )
    webhook_backoff_max_s: float = Field(
        default=600.0, gt=0, description="Longest delay between two attempts of a webhook."
    )
    webhook_deadline_s: float = Field(
        default=86_400.0,
        gt=0,
        description="A webhook not delivered this long after its first attempt is given up.",
    )
    webhook_max_attempts: int = Field(
        default=20, ge=1, description="Attempts of one webhook notification at most."
    )
    webhook_concurrency: int = Field(
        default=16, ge=1, le=256, description="Webhook POSTs in flight at once per gateway."
    )
    admin_api_key: SecretStr | None = Field(
        default=None,
        description="The key of the admin API (/v1/admin: tenants and their API keys), at "
        "least 32 characters; unset or empty: the admin API answers 401 to everyone. On "
        "Kubernetes it comes from the Secret deckhands-gateway-admin.",
    )

    @model_validator(mode="after")
    def _presets_are_within_the_bound(self) -> GatewaySettings:
        bound = EgressPolicy(allow=tuple(self.egress_allow))
        for name, rules in self.egress_presets.items():
            outside = policy_outside(EgressPolicy(allow=tuple(rules)), bound)
            if outside is not None:
                raise ValueError(
                    f"DECKHANDS_EGRESS_PRESETS: the rule {outside!r} of the preset {name!r} is "
                    "outside DECKHANDS_EGRESS_ALLOW"
                )
        return self

    @field_validator("admin_api_key")
    @classmethod
    def _admin_key_is_long(cls, value: SecretStr | None) -> SecretStr | None:
        if value is None or not value.get_secret_value():
            return None
        if len(value.get_secret_value()) < 32:
            raise ValueError("must be at least 32 characters (e.g. `openssl rand -hex 32`)")
        return value
