"""Pod Security "restricted" where the namespace enforces it, and sandbox nodes kept apart.

The admission controller would refuse a non-conforming pod only at `kubectl apply` time, on a
real cluster, as a ReplicaSet event nobody reads. The checks below are those of the Pod
Security Standards' restricted profile (https://kubernetes.io/docs/concepts/security/
pod-security-standards/) applied to every pod template that kustomize renders.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest
from k8s_manifests import TARGETS, Document, by_name, name, render, workloads

RESTRICTED_VOLUMES = {
    "configMap",
    "csi",
    "downwardAPI",
    "emptyDir",
    "ephemeral",
    "persistentVolumeClaim",
    "projected",
    "secret",
}
SAFE_SYSCTLS = {
    "kernel.shm_rmid_forced",
    "net.ipv4.ip_local_port_range",
    "net.ipv4.ip_unprivileged_port_start",
    "net.ipv4.tcp_syncookies",
    "net.ipv4.ping_group_range",
    "net.ipv4.ip_local_reserved_ports",
    "net.ipv4.tcp_keepalive_time",
    "net.ipv4.tcp_fin_timeout",
    "net.ipv4.tcp_keepalive_intvl",
    "net.ipv4.tcp_keepalive_probes",
}
SANDBOX_TAINT = "deckhands.dev/sandbox-node"


def restricted_violations(spec: dict[str, Any]) -> list[str]:
    """What keeps a pod spec from the restricted profile (empty: it conforms)."""
    found = []
    for host in ("hostNetwork", "hostPID", "hostIPC"):
        if spec.get(host):
            found.append(host)
    pod = spec.get("securityContext", {})
    for sysctl in pod.get("sysctls", []):
        if sysctl["name"] not in SAFE_SYSCTLS:
            found.append(f"sysctl {sysctl['name']}")
    for volume in spec.get("volumes", []):
        kinds = set(volume) - {"name"}
        if not kinds <= RESTRICTED_VOLUMES:
            found.append(f"volume {volume['name']}: {sorted(kinds)}")
    every = [
        *spec.get("initContainers", []),
        *spec["containers"],
        *spec.get("ephemeralContainers", []),
    ]
    for container in every:
        where = f"container {container['name']}"
        context = container.get("securityContext", {})
        if context.get("privileged"):
            found.append(f"{where}: privileged")
        if context.get("allowPrivilegeEscalation") is not False:
            found.append(f"{where}: allowPrivilegeEscalation is not false")
        if context.get("runAsNonRoot", pod.get("runAsNonRoot")) is not True:
            found.append(f"{where}: runAsNonRoot")
        if context.get("runAsUser", pod.get("runAsUser")) == 0:
            found.append(f"{where}: runAsUser 0")
        capabilities = context.get("capabilities", {})
        if "ALL" not in capabilities.get("drop", []):
            found.append(f"{where}: capabilities not dropped")
        if set(capabilities.get("add", [])) - {"NET_BIND_SERVICE"}:
            found.append(f"{where}: adds {capabilities['add']}")
        seccomp = context.get("seccompProfile", pod.get("seccompProfile", {})).get("type")
        if seccomp not in ("RuntimeDefault", "Localhost"):
            found.append(f"{where}: seccomp {seccomp}")
        if context.get("procMount", "Default") != "Default":
            found.append(f"{where}: procMount")
        for port in container.get("ports", []):
            if port.get("hostPort"):
                found.append(f"{where}: hostPort {port['hostPort']}")
    return found


def _enforced(documents: tuple[Document, ...]) -> str:
    [namespace] = [d for d in documents if d["kind"] == "Namespace"]
    level: str = namespace["metadata"]["labels"]["pod-security.kubernetes.io/enforce"]
    return level


@pytest.mark.parametrize("target", TARGETS)
def test_pods_meet_the_level_their_namespace_enforces(target: str) -> None:
    documents = render(target)
    level = _enforced(documents)
    failing = {
        name(w): restricted_violations(w["spec"]["template"]["spec"]) for w in workloads(documents)
    }
    failing = {k: v for k, v in failing.items() if v}
    if level == "restricted":
        assert not failing, f"{target}: {failing}"
    else:
        # A weaker level only where a pod needs it: the DinD sidecar of the runtime.
        assert level == "privileged" and set(failing) == {"Deployment/runtime"}, failing


def test_prod_enforces_restricted() -> None:
    documents = render("prod")
    assert _enforced(documents) == "restricted"
    labels = next(d for d in documents if d["kind"] == "Namespace")["metadata"]["labels"]
    assert labels["pod-security.kubernetes.io/warn"] == "restricted"


def test_the_check_rejects_what_restricted_refuses() -> None:
    base = render("base")
    runtime = by_name(base, "Deployment")["runtime"]["spec"]["template"]["spec"]
    assert any("privileged" in v for v in restricted_violations(runtime))
    controller = by_name(base, "Deployment")["controller"]["spec"]["template"]["spec"]
    assert restricted_violations(controller) == []
    for breaking in (
        lambda s: s.update(hostNetwork=True),
        lambda s: s["volumes"].append({"name": "sock", "hostPath": {"path": "/run/docker.sock"}}),
        lambda s: s["containers"][0]["securityContext"].pop("allowPrivilegeEscalation"),
        lambda s: s["containers"][0]["securityContext"]["capabilities"].update(add=["SYS_ADMIN"]),
        lambda s: s["securityContext"].pop("seccompProfile"),
        lambda s: s["securityContext"].update(runAsNonRoot=False),
    ):
        broken = copy.deepcopy(controller)
        breaking(broken)
        assert restricted_violations(broken), breaking


@pytest.mark.parametrize("target", ["prod", "base+gvisor-sandbox-nodes"])
def test_the_runtime_runs_on_gvisor_sandbox_nodes_and_nothing_else_does(target: str) -> None:
    documents = render(target)
    runtime = by_name(documents, "DaemonSet")["runtime"]
    assert "runtime" not in by_name(documents, "Deployment")
    spec = runtime["spec"]["template"]["spec"]
    runtime_class = by_name(documents, "RuntimeClass")[spec["runtimeClassName"]]
    assert runtime_class["handler"] == "runsc"
    scheduling = runtime_class["scheduling"]
    assert scheduling["nodeSelector"] == {SANDBOX_TAINT: "true"}
    assert {(t["key"], t["effect"]) for t in scheduling["tolerations"]} == {
        (SANDBOX_TAINT, "NoSchedule")
    }
    env = {e["name"]: e for e in spec["containers"][0]["env"]}
    # The node's own engine, over mutual TLS: no socket on a hostPath.
    assert env["DOCKER_HOST"]["value"] == "tcp://$(HOST_IP):2376"
    assert env["HOST_IP"]["valueFrom"]["fieldRef"]["fieldPath"] == "status.hostIP"
    assert env["DOCKER_TLS_VERIFY"]["value"] == "1"
    mounts = {m["mountPath"]: m["name"] for m in spec["containers"][0]["volumeMounts"]}
    secret = next(
        v for v in spec["volumes"] if v["name"] == mounts[env["DOCKER_CERT_PATH"]["value"]]
    )
    assert secret["secret"]["secretName"] == "deckhands-docker-tls"
    assert env["DECKHANDS_DOCKER_RUNTIME"]["value"] == "runsc"
    # Nothing else may land on (or tolerate) the sandbox nodes.
    for workload in workloads(documents):
        if workload is runtime:
            continue
        other = workload["spec"]["template"]["spec"]
        assert other.get("runtimeClassName") != spec["runtimeClassName"], name(workload)
        tolerated = {t.get("key") for t in other.get("tolerations", [])}
        assert SANDBOX_TAINT not in tolerated, name(workload)
        assert SANDBOX_TAINT not in other.get("nodeSelector", {}), name(workload)
