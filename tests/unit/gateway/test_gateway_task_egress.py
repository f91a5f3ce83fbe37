"""A new task's egress policy (services/gateway/tasks/egress.py): the union of its rules and
presets within its bound, `network_egress` as the whole bound, the old plain network only where
no bound is set; the operator's settings and a tenant's bound, each within the server's."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from services.gateway.errors import EgressForbidden, EgressPolicyRefused
from services.gateway.quotas.limits import QuotaDefaults, Quotas, TenantLimits
from services.gateway.settings import GatewaySettings
from services.gateway.tasks.egress import TaskEgress, TaskNetwork, message_egress, task_egress
from services.gateway.tasks.values import NewTask, TaskDefaults
from shared.egress_policy import EgressPolicy

SERVER_RULES = ("pypi.org", "files.pythonhosted.org", "*.github.com:443")
SERVER = EgressPolicy(allow=SERVER_RULES)
DEFAULTS = TaskDefaults(
    egress_presets={"python": EgressPolicy(allow=("pypi.org", "files.pythonhosted.org"))}
)


def _new(*allow: str, presets: tuple[str, ...] = (), network_egress: bool = False) -> NewTask:
    return NewTask("x", network_allow=allow, network_presets=presets, network_egress=network_egress)


def test_a_policy_is_the_union_of_its_rules_and_presets_within_the_bound() -> None:
    egress = task_egress(
        _new("api.github.com:443", "pypi.org", presets=("python",)), DEFAULTS, SERVER_RULES, False
    )
    assert egress == TaskEgress(
        network=EgressPolicy(allow=("api.github.com:443", "pypi.org", "files.pythonhosted.org"))
    )
    assert task_egress(_new(), DEFAULTS, SERVER_RULES, False) == TaskEgress()  # no network
    # Nothing asked (or an empty `network`): no network, whatever the bound.
    assert task_egress(_new(), DEFAULTS, (), False) == TaskEgress()
    # A preset alone, within the bound.
    only_preset = task_egress(_new(presets=("python",)), DEFAULTS, SERVER_RULES, True)
    assert only_preset.network == EgressPolicy(allow=("pypi.org", "files.pythonhosted.org"))


def test_a_policy_wider_than_its_bound_or_an_unknown_preset_is_a_422_naming_it() -> None:
    with pytest.raises(EgressPolicyRefused, match=r"'api\.github\.com' is outside") as refused:
        task_egress(_new("pypi.org", "api.github.com"), DEFAULTS, SERVER_RULES, False)
    assert refused.value.status_code == 422
    assert "DECKHANDS_EGRESS_ALLOW" in refused.value.detail
    with pytest.raises(EgressPolicyRefused, match="its egress_allow"):
        task_egress(_new(presets=("python",)), DEFAULTS, ("pypi.org",), True)
    with pytest.raises(EgressPolicyRefused, match=r"unknown preset 'node' \(.*: python\)"):
        task_egress(_new(presets=("python", "node")), DEFAULTS, SERVER_RULES, False)
    many = tuple(f"h{i}.github.com:443" for i in range(63))
    with pytest.raises(EgressPolicyRefused, match="65 rules with the presets', more than 64"):
        task_egress(_new(*many, presets=("python",)), DEFAULTS, SERVER_RULES, False)


def test_network_egress_is_the_whole_bound_else_the_old_network_else_403() -> None:
    assert task_egress(_new(network_egress=True), DEFAULTS, SERVER_RULES, False) == TaskEgress(
        network=SERVER
    )
    tenant = task_egress(_new(network_egress=True), DEFAULTS, ("pypi.org",), True)
    assert tenant.network == EgressPolicy(allow=("pypi.org",))
    # No bound: the old plain network where the operator allows it, for a tenant without one.
    legacy = TaskDefaults(network_egress_allowed=True)
    nothing: tuple[str, ...] = ()
    assert task_egress(_new(network_egress=True), legacy, nothing, False) == TaskEgress(
        network_egress=True
    )
    with pytest.raises(EgressForbidden, match="DECKHANDS_ALLOW_NETWORK_EGRESS=false") as refused:
        task_egress(_new(network_egress=True), DEFAULTS, nothing, False)
    assert refused.value.status_code == 403
    # A tenant the operator gave no egress gets none, the old network neither.
    with pytest.raises(EgressForbidden, match="its egress_allow is empty"):
        task_egress(_new(network_egress=True), legacy, nothing, True)


def test_the_settings_keep_each_preset_within_the_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    assert (GatewaySettings().egress_allow, GatewaySettings().egress_presets) == ([], {})
    monkeypatch.setenv("DECKHANDS_EGRESS_ALLOW", '["PyPI.org", "*.github.com:443"]')
    monkeypatch.setenv("DECKHANDS_EGRESS_PRESETS", '{"python": ["pypi.org"]}')
    settings = GatewaySettings()
    assert settings.egress_allow == ["pypi.org", "*.github.com:443"]
    assert settings.egress_presets == {"python": ["pypi.org"]}
    monkeypatch.setenv("DECKHANDS_EGRESS_PRESETS", '{"gh": ["api.github.com:443", "github.com"]}')
    with pytest.raises(ValidationError, match=r"the rule 'github\.com' of the preset 'gh' is outs"):
        GatewaySettings()
    monkeypatch.setenv("DECKHANDS_EGRESS_PRESETS", '{"bad name": ["pypi.org"]}')
    with pytest.raises(ValidationError, match="egress_presets"):
        GatewaySettings()
    monkeypatch.setenv("DECKHANDS_EGRESS_PRESETS", "{}")
    monkeypatch.setenv("DECKHANDS_EGRESS_ALLOW", '["pypi.org", "a b"]')
    with pytest.raises(ValidationError, match="'a b' is not a host name"):
        GatewaySettings()


def test_a_tenants_bound_is_its_own_within_the_servers_as_it_is_now() -> None:
    defaults = QuotaDefaults(egress_allow=("pypi.org", "*.github.com"))
    assert Quotas.of(TenantLimits(), defaults).egress_allow == ("pypi.org", "*.github.com")
    own = TenantLimits(egress_allow=("PyPI.org",))
    assert own.egress_allow == ("pypi.org",)
    assert Quotas.of(own, defaults).egress_allow == ("pypi.org",)
    assert Quotas.of(TenantLimits(egress_allow=()), defaults).egress_allow == ()
    # The operator has since taken a rule out of the server's bound: it no longer counts.
    narrower = QuotaDefaults(egress_allow=("*.github.com",))
    wide = TenantLimits(egress_allow=("pypi.org", "api.github.com"))
    assert Quotas.of(wide, narrower).egress_allow == ("api.github.com",)


def test_a_message_adds_rules_within_the_bound_and_only_to_a_task_with_a_policy() -> None:
    current = EgressPolicy(allow=("pypi.org",))
    more = message_egress(
        TaskNetwork(allow=["*.github.com:443"], presets=["python"]),
        current,
        DEFAULTS,
        SERVER_RULES,
        False,
    )
    assert more == EgressPolicy(allow=("*.github.com:443", "pypi.org", "files.pythonhosted.org"))
    with pytest.raises(EgressPolicyRefused, match=r"'evil\.example\.com' is outside"):
        message_egress(
            TaskNetwork(allow=["evil.example.com"]), current, DEFAULTS, SERVER_RULES, True
        )
    with pytest.raises(EgressPolicyRefused, match="created without network access"):
        message_egress(TaskNetwork(allow=["pypi.org"]), None, DEFAULTS, SERVER_RULES, False)


def test_what_holds_between_actions_lies_within_the_tasks_policy() -> None:
    """Issue 27, item 6: a task may keep some of its rules between actions (a dev server the
    agent left running that fetches packages); none outside its policy, none without one."""
    new = NewTask(
        "x", network_allow=("pypi.org", "*.github.com:443"), network_between_actions=("pypi.org",)
    )
    policy = task_egress(new, DEFAULTS, SERVER_RULES, False).network
    assert policy == EgressPolicy(
        allow=("pypi.org", "*.github.com:443"), between_actions=("pypi.org",)
    )
    assert policy.background() == EgressPolicy(allow=("pypi.org",))
    assert EgressPolicy(allow=("pypi.org",)).background() == EgressPolicy()  # nothing by default
    whole = NewTask("x", network_egress=True, network_between_actions=("api.github.com:443",))
    assert task_egress(whole, DEFAULTS, SERVER_RULES, False).network == EgressPolicy(
        allow=SERVER_RULES, between_actions=("api.github.com:443",)
    )
    outside = NewTask("x", network_allow=("pypi.org",), network_between_actions=("github.com",))
    with pytest.raises(EgressPolicyRefused, match=r"between_actions: the rule 'github\.com'"):
        task_egress(outside, DEFAULTS, SERVER_RULES, False)
    alone = NewTask("x", network_between_actions=("pypi.org",))
    with pytest.raises(EgressPolicyRefused, match="between_actions needs rules"):
        task_egress(alone, DEFAULTS, SERVER_RULES, False)
    with pytest.raises(ValidationError, match="not within the task's `allow`"):
        EgressPolicy(allow=("pypi.org",), between_actions=("*.github.com:443",))
    # A message may keep a rule the task already had, or one it adds, never another.
    current = EgressPolicy(allow=("pypi.org", "*.github.com:443"))
    kept = message_egress(
        TaskNetwork(between_actions=["api.github.com:443"]), current, DEFAULTS, SERVER_RULES, False
    )
    assert current.union(kept) == EgressPolicy(
        allow=("pypi.org", "*.github.com:443", "api.github.com:443"),
        between_actions=("api.github.com:443",),
    )
    with pytest.raises(EgressPolicyRefused, match=r"the rule 'files\.pythonhosted\.org'"):
        message_egress(
            TaskNetwork(between_actions=["files.pythonhosted.org"]),
            current,
            DEFAULTS,
            SERVER_RULES,
            False,
        )
