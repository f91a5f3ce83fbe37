"""Runtime logic that needs no Docker: settings, names, ids, scaling, wiring."""

from __future__ import annotations

import time

import pytest
from pydantic import ValidationError

from services.runtime.actions import observation_id
from services.runtime.containers import DockerSandboxes, task_container_name
from services.runtime.main import build_app
from services.runtime.pool import WarmPool
from services.runtime.service import RuntimeService
from services.runtime.settings import RuntimeSettings
from shared.commands import ExecuteAction
from shared.events import CmdRunAction, ErrorObservation, EventBase, EventSource


def test_settings_defaults_and_validation() -> None:
    s = RuntimeSettings()
    assert s.sandbox_image == "deckhands/sandbox:latest"
    assert (s.pool_min_idle, s.workers, s.output_limit) == (2, 512, 30_000)
    assert s.sandbox_network is False
    with pytest.raises(ValidationError, match="size"):
        RuntimeSettings(sandbox_memory="lots")
    with pytest.raises(ValidationError, match="exceeds pool_max_total"):
        RuntimeSettings(pool_min_idle=5, pool_max_total=2, pool_max_idle=5)
    with pytest.raises(ValidationError, match="workspace kind"):
        RuntimeSettings(sandbox_workspace="hostpath")


def test_settings_come_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DECKHANDS_POOL_MIN_IDLE", "5")
    monkeypatch.setenv("DECKHANDS_DOCKER_RUNTIME", "runsc")
    monkeypatch.setenv("DECKHANDS_SANDBOX_NETWORK", "true")
    s = RuntimeSettings()
    assert (s.pool_min_idle, s.docker_runtime, s.sandbox_network) == (5, "runsc", True)


def test_every_setting_is_documented() -> None:
    common = {
        "nats_url",
        "redis_url",
        "metrics_port",
        "log_level",
        "max_deliveries",
        "retry_backoff_s",
        "retry_backoff_max_s",
        "ack_wait_s",
        "stream_max_age_days",
        "otel_exporter",
        "otel_endpoint",
    }
    undocumented = [
        name
        for name, field in RuntimeSettings.model_fields.items()
        if name not in common and not field.description
    ]
    assert undocumented == []


def test_hardening_is_the_default() -> None:
    hc = DockerSandboxes(RuntimeSettings(), "r").host_config()
    assert hc["network_mode"] == "none"
    assert hc["read_only"] is True
    assert hc["cap_drop"] == ["ALL"]
    assert hc["security_opt"] == ["no-new-privileges"]
    assert hc["init"] is True
    # runc: the pids cgroup counts the sandbox's processes; no RLIMIT_NPROC, which Linux would
    # count for uid 1000 across every sandbox of the host.
    assert hc["pids_limit"] == 512
    assert "nproc" not in {u["Name"] for u in hc["ulimits"]}
    assert hc["cap_add"] == ["SETUID", "SETGID"]  # for holder.py's two setuids only
    # The workspace's quota is a tmpfs whose pages are charged to the sandbox: 1 GiB for the
    # processes plus 2 GiB for /workspace.
    assert hc["mem_limit"] == hc["memswap_limit"] == 3 << 30
    [workspace] = hc["mounts"]
    assert workspace["Type"] == "volume" and workspace["Target"] == "/workspace"
    assert workspace["VolumeOptions"]["DriverConfig"] == {
        "Name": "local",
        "Options": {
            "type": "tmpfs",
            "device": "tmpfs",
            "o": f"size={2 << 30},nr_inodes=262144,uid=1000,gid=1000,mode=0755",
        },
    }
    assert "nr_inodes=262144" in hc["tmpfs"]["/tmp"]
    assert "binds" not in hc and "volumes" not in hc
    opted = DockerSandboxes(
        RuntimeSettings(sandbox_network=True, docker_runtime="runsc", sandbox_workspace="volume"),
        "r",
    ).host_config()
    assert opted["network_mode"] == "bridge"
    assert opted["runtime"] == "runsc"
    # gVisor: no Docker init; the guest's processes counted by gVisor's RLIMIT_NPROC, the host's
    # pids cgroup sized for the ptrace platform's stubs.
    assert opted["init"] is False
    assert {u["Name"]: u["Soft"] for u in opted["ulimits"]}["nproc"] == 512
    assert opted["pids_limit"] == 512 * 16
    assert [m["Type"] for m in opted["mounts"]] == ["volume"]
    assert "DriverConfig" not in opted["mounts"][0]["VolumeOptions"]  # no quota on disk
    assert opted["mem_limit"] == 1 << 30  # no workspace in memory


def test_task_container_names_are_valid_docker_names() -> None:
    assert task_container_name("abc123") == "deckhands-task-abc123"
    odd = task_container_name("user:42/weird id")
    assert odd.startswith("deckhands-task-h") and len(odd) < 64
    assert odd == task_container_name("user:42/weird id")


def test_observation_ids_are_deterministic() -> None:
    assert observation_id("a1") == observation_id("a1")
    assert observation_id("a1") != observation_id("a2")
    assert len(observation_id("a1")) == 32


async def test_pool_target_grows_with_acquisition_rate() -> None:
    settings = RuntimeSettings(pool_min_idle=2, pool_max_idle=10, pool_scale_window_s=10)
    pool = WarmPool(settings, DockerSandboxes(settings, "r"))
    assert pool.target_idle() == 2
    now = time.monotonic()
    pool._cold_starts.extend([0.5, 0.5, 0.5])
    pool._acquired_at.extend(now - i * 0.1 for i in range(40))  # 4 per second
    assert pool.target_idle() == 2 + 4  # 2 * (4/s * 0.5 s)
    pool._acquired_at.extend(now for _ in range(400))
    assert pool.target_idle() == 10  # capped by pool_max_idle
    pool._acquired_at.clear()
    pool._acquired_at.append(now - 60)  # outside the window
    assert pool.target_idle() == 2


def test_build_app_does_no_io() -> None:
    # Unreachable servers: building must still work (the AsyncAPI generator relies on it).
    app = build_app(
        RuntimeSettings(
            nats_url="nats://127.0.0.1:1",
            redis_url="redis://127.0.0.1:1",
            runtime_replica="node-1.zone.internal",
        )
    )
    subjects = [sub.subject.broker_address for sub in app.broker.subscribers]  # type: ignore[union-attr]
    # The shared queue and workspace requests, and this replica's own (its name a token).
    assert sorted(subjects) == [
        "deckhands.deletions.*",
        "deckhands.routed.runtime.node-1_zone_internal.*",
        "deckhands.runtime.workspace",
        "deckhands.runtime.workspace.node-1_zone_internal",
        "deckhands.work.runtime.*",
    ]


async def test_egress_is_refused_when_the_runtime_disallows_it() -> None:
    published: list[EventBase] = []

    async def publish(event: EventBase) -> None:
        published.append(event)

    service = RuntimeService(RuntimeSettings(allow_network_egress=False), publish)
    action = CmdRunAction(task_id="t", source=EventSource.AGENT, command="curl example.com")
    observation = await service.execution.run(
        ExecuteAction(task_id="t", action=action, network_egress=True), last_try=False
    )
    assert isinstance(observation, ErrorObservation)
    assert observation.error_code == "egress_forbidden" and observation.cause == action.id
    assert "DECKHANDS_ALLOW_NETWORK_EGRESS" in observation.content


def test_a_sandbox_network_that_shares_the_host_is_refused() -> None:
    for bad in ("host", "none", "container:abc"):
        with pytest.raises(ValidationError, match="not allowed"):
            RuntimeSettings(sandbox_network_name=bad)
