"""NATS is one server in the base and the dev overlay, a three-server JetStream cluster in prod
(components/nats-cluster): the routes name every server, the services list them all and keep
three replicas of each stream, a budget lets a drain take one server at a time, and the `nats`
Service carries clients only (the monitor port is reached on the pods)."""

from __future__ import annotations

import re

import pytest
from k8s_manifests import TARGETS, by_name, render

from shared.settings import CommonSettings


def _nats(target: str) -> tuple[dict, dict, dict]:  # type: ignore[type-arg]
    documents = render(target)
    return (
        by_name(documents, "StatefulSet")["nats"],
        by_name(documents, "ConfigMap"),
        by_name(documents, "PodDisruptionBudget"),
    )


def test_prod_runs_a_three_server_cluster_with_three_replicas() -> None:
    nats, config_maps, budgets = _nats("prod")
    assert nats["spec"]["replicas"] == 3
    assert nats["spec"]["podManagementPolicy"] == "Parallel"
    cluster = config_maps["nats-config"]["data"]["cluster.conf"]
    routes = re.findall(r"nats://(nats-\d)\.nats-headless:6222", cluster)
    assert routes == ["nats-0", "nats-1", "nats-2"]
    settings = config_maps["deckhands-settings"]["data"]
    assert settings["DECKHANDS_STREAM_REPLICAS"] == "3"
    common = CommonSettings(nats_url=settings["DECKHANDS_NATS_URL"])
    assert common.nats_servers == [f"nats://nats-{i}.nats-headless:4222" for i in range(3)]
    assert budgets["nats"]["spec"]["maxUnavailable"] == 1
    spread = nats["spec"]["template"]["spec"]["topologySpreadConstraints"]
    assert {"kubernetes.io/hostname": "DoNotSchedule"}.items() <= {
        c["topologyKey"]: c["whenUnsatisfiable"] for c in spread
    }.items()


@pytest.mark.parametrize("target", [t for t in TARGETS if t != "prod"])
def test_elsewhere_nats_is_one_server_without_routes(target: str) -> None:
    nats, config_maps, budgets = _nats(target)
    assert nats["spec"]["replicas"] == 1
    assert "routes" not in config_maps["nats-config"]["data"]["cluster.conf"]
    assert config_maps["deckhands-settings"]["data"].get("DECKHANDS_STREAM_REPLICAS", "1") == "1"
    assert "nats" not in budgets  # a budget on one server would block every drain


@pytest.mark.parametrize("target", TARGETS)
def test_the_nats_service_exposes_only_the_client_port(target: str) -> None:
    services = by_name(render(target), "Service")
    assert [p["port"] for p in services["nats"]["spec"]["ports"]] == [4222]
    headless = services["nats-headless"]["spec"]
    assert headless["clusterIP"] == "None" and headless["publishNotReadyAddresses"] is True


def test_a_list_of_servers_is_accepted_and_a_bad_one_named() -> None:
    both = CommonSettings(nats_url="nats://a:4222, nats://b:4222")
    assert both.nats_servers == ["nats://a:4222", "nats://b:4222"]
    with pytest.raises(ValueError, match="'b:4222' is not a URL"):
        CommonSettings(nats_url="nats://a:4222,b:4222")
