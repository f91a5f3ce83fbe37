"""Autoscaling, disruption budgets and spread agree with the code and with each other.

- A ScaledObject scales each stateless consumer on the JetStream consumer that service really
  declares (services/*/main.py, parsed), through the NATS servers' monitor port (the headless
  Service: the `nats` Service carries clients only).
- The runtime and storage are never scaled (base/runtime.yaml and components/keda say why).
- The KEDA and CPU components scale the same Deployments within the same bounds, and drop
  spec.replicas so that an apply does not undo them.
- Every service has a PDB that lets a drain go on and topology spread over its own pods.
"""

from __future__ import annotations

import ast

import pytest
from k8s_manifests import (
    ROOT,
    TARGETS,
    Document,
    by_name,
    container_ports,
    matches,
    pod_labels,
    render,
    workloads,
)

from shared.broker import DELETIONS, EVENTS, ROUTED, WORK

STREAMS = {
    "WORK": WORK.name,
    "EVENTS": EVENTS.name,
    "DELETIONS": DELETIONS.name,
    "ROUTED": ROUTED.name,
}
# Scaling them would break them; the reasons are in the manifests.
NEVER_SCALED = {"runtime", "storage"}
# Services that run as sidecars of another's pod, and scale with it: the egress proxy lives in
# the runtime's pod, whose engine mounts its sockets into the sandboxes (docs/runtime.md#egress).
SIDECARS = {"egress": "runtime"}
SERVICES = sorted(
    p.parent.name for p in (ROOT / "services").glob("*/main.py") if p.parent.name not in SIDECARS
)


def declared_consumers() -> dict[str, tuple[str, str | None]]:
    """service -> (stream, durable name), None when the name is computed (one per replica)."""
    consumers: dict[str, tuple[str, str | None]] = {}
    for main in sorted((ROOT / "services").glob("*/main.py")):
        for node in ast.walk(ast.parse(main.read_text())):
            if (
                isinstance(node, ast.Call)
                and getattr(node.func, "id", None) == "durable_subscription"
            ):
                stream = STREAMS[getattr(node.args[1], "id", "")]
                durable = node.args[2]
                shared = (
                    durable.value
                    if isinstance(durable, ast.Constant) and isinstance(durable.value, str)
                    else None
                )
                # A service's first consumer is its work, what it scales on (storage also
                # reads the deletions, beside the log).
                consumers.setdefault(main.parent.name, (stream, shared))
    return consumers


def test_consumers_are_found_in_the_code() -> None:
    consumers = declared_consumers()
    assert consumers["controller"] == (WORK.name, "controller")
    assert consumers["storage"] == (EVENTS.name, None)  # storage-0, storage-1, ...
    assert "gateway" not in consumers


def test_every_shared_consumer_scales_on_its_own_backlog() -> None:
    documents = render("prod")
    scaled = by_name(documents, "ScaledObject")
    shared = {s for s, (_, durable) in declared_consumers().items() if durable is not None}
    assert set(scaled) == shared - NEVER_SCALED
    services = by_name(documents, "Service")
    assert [p["name"] for p in services["nats"]["spec"]["ports"]] == ["client"]
    headless = services["nats-headless"]
    assert headless["spec"]["clusterIP"] == "None"
    monitor = next(p["port"] for p in headless["spec"]["ports"] if p["name"] == "monitor")
    nats_pods = container_ports(by_name(documents, "StatefulSet")["nats"])
    assert nats_pods["monitor"] == 8222
    for service, scaled_object in scaled.items():
        spec = scaled_object["spec"]
        assert spec["scaleTargetRef"]["name"] == service
        assert spec["scaleTargetRef"].get("kind", "Deployment") == "Deployment"
        [trigger] = spec["triggers"]
        metadata = trigger["metadata"]
        stream, durable = declared_consumers()[service]
        assert (metadata["stream"], metadata["consumer"]) == (stream, durable), service
        assert metadata.get("account", "$G") == "$G"  # NATS without accounts
        # KEDA runs in its own namespace: the Service's full name and its monitor port; with a
        # cluster it prefixes the consumer leader's name (a pod of the headless Service).
        assert metadata["natsServerMonitoringEndpoint"] == (
            f"nats-headless.{scaled_object['metadata']['namespace']}.svc.cluster.local:{monitor}"
        )
        low, high = spec["minReplicaCount"], spec["maxReplicaCount"]
        assert 2 <= low < high, f"{service}: {low}..{high}"
        assert low <= spec["fallback"]["replicas"] <= high
        down = spec["advanced"]["horizontalPodAutoscalerConfig"]["behavior"]["scaleDown"]
        # Slower than a stopped pod's orders take to come back (ack_wait, 60 s by default).
        assert down["stabilizationWindowSeconds"] >= 60


@pytest.mark.parametrize("target", TARGETS)
def test_the_runtime_and_storage_keep_their_fixed_replicas(target: str) -> None:
    documents = render(target)
    for kind in ("ScaledObject", "HorizontalPodAutoscaler"):
        targets = {d["spec"]["scaleTargetRef"]["name"] for d in by_name(documents, kind).values()}
        assert not targets & NEVER_SCALED, f"{target}: {kind} on {targets & NEVER_SCALED}"
    # Each runtime pod has its own engine; a second pod loses the first one's sandboxes. On
    # sandbox nodes it is a DaemonSet: one per node, the pool's size is the operator's.
    runtime = _service_workload(documents, "runtime")
    if runtime["kind"] == "Deployment":
        assert runtime["spec"]["replicas"] == 1
    else:
        assert runtime["kind"] == "DaemonSet", runtime["kind"]


def test_keda_and_the_cpu_fallback_scale_the_same_within_the_same_bounds() -> None:
    keda = by_name(render("prod"), "ScaledObject")
    hpa = by_name(render("base+hpa-cpu"), "HorizontalPodAutoscaler")
    assert set(keda) == set(hpa)
    for service, scaled in keda.items():
        autoscaler = hpa[service]["spec"]
        assert autoscaler["scaleTargetRef"]["name"] == service
        assert (autoscaler["minReplicas"], autoscaler["maxReplicas"]) == (
            scaled["spec"]["minReplicaCount"],
            scaled["spec"]["maxReplicaCount"],
        )
        behavior = scaled["spec"]["advanced"]["horizontalPodAutoscalerConfig"]["behavior"]
        assert autoscaler["behavior"] == behavior
        [metric] = autoscaler["metrics"]
        assert metric["resource"]["name"] == "cpu"


@pytest.mark.parametrize("target", ["prod", "base+hpa-cpu"])
def test_autoscaled_deployments_leave_replicas_to_the_autoscaler(target: str) -> None:
    documents = render(target)
    scaled = {
        d["spec"]["scaleTargetRef"]["name"]
        for d in documents
        if d["kind"] in ("ScaledObject", "HorizontalPodAutoscaler")
    }
    assert scaled
    for name, deployment in by_name(documents, "Deployment").items():
        assert ("replicas" in deployment["spec"]) == (name not in scaled), name


def test_no_target_has_two_autoscalers() -> None:
    for target in TARGETS:
        documents = render(target)
        keda = {
            d["spec"]["scaleTargetRef"]["name"] for d in by_name(documents, "ScaledObject").values()
        }
        hpa = {
            d["spec"]["scaleTargetRef"]["name"]
            for d in by_name(documents, "HorizontalPodAutoscaler").values()
        }
        assert not keda & hpa, target


def _service_workload(documents: tuple[Document, ...], service: str) -> Document:
    return next(w for w in workloads(documents) if w["metadata"]["name"] == service)


@pytest.mark.parametrize("target", TARGETS)
def test_every_service_has_a_budget_that_lets_a_drain_proceed(target: str) -> None:
    documents = render(target)
    budgets = by_name(documents, "PodDisruptionBudget")
    for service in SERVICES:
        labels = pod_labels(_service_workload(documents, service))
        covering = [b for b in budgets.values() if matches(b["spec"]["selector"], labels)]
        assert len(covering) == 1, f"{target}: {service} has {len(covering)} budgets"
        spec = covering[0]["spec"]
        # minAvailable would block every drain of a one-replica service (dev, the runtime).
        assert "minAvailable" not in spec and spec["maxUnavailable"] >= 1, service
        assert spec.get("unhealthyPodEvictionPolicy") == "AlwaysAllow", service
    for budget in budgets.values():
        selected = [
            w for w in workloads(documents) if matches(budget["spec"]["selector"], pod_labels(w))
        ]
        assert selected, (
            f"{target}: PodDisruptionBudget/{budget['metadata']['name']} selects nothing"
        )


@pytest.mark.parametrize("target", TARGETS)
def test_every_service_spreads_its_own_pods_over_nodes_and_zones(target: str) -> None:
    documents = render(target)
    for service in SERVICES:
        workload = _service_workload(documents, service)
        if workload["kind"] == "DaemonSet":
            continue  # one pod per chosen node: placement is the node pool's
        constraints = workload["spec"]["template"]["spec"].get("topologySpreadConstraints", [])
        keys = {c["topologyKey"] for c in constraints}
        assert keys == {"kubernetes.io/hostname", "topology.kubernetes.io/zone"}, service
        for constraint in constraints:
            assert matches(constraint["labelSelector"], pod_labels(workload)), service
            # Another service's pods in the selector would skew this one's spread.
            others = [
                w
                for w in workloads(documents)
                if w is not workload and matches(constraint["labelSelector"], pod_labels(w))
            ]
            assert not others, service
            # A hard constraint can leave a pod Pending on a cluster with one zone.
            assert constraint["whenUnsatisfiable"] == "ScheduleAnyway", service


def test_prod_runs_more_than_dev() -> None:
    prod, dev = render("prod"), render("dev")
    scaled = {
        d["spec"]["scaleTargetRef"]["name"]: d["spec"]
        for d in by_name(prod, "ScaledObject").values()
    }
    for service in SERVICES:
        dev_replicas = _service_workload(dev, service)["spec"]["replicas"]
        assert dev_replicas == 1, service
        if service == "runtime":
            continue  # one replica, or one per sandbox node
        spec = _service_workload(prod, service)["spec"]
        prod_replicas = (
            scaled[service]["minReplicaCount"] if service in scaled else spec["replicas"]
        )
        assert prod_replicas >= 2, service
    assert not by_name(dev, "ScaledObject") and not by_name(dev, "HorizontalPodAutoscaler")


def _requests(documents: tuple[Document, ...], service: str) -> dict[str, str]:
    workload = _service_workload(documents, service)
    requests: dict[str, str] = workload["spec"]["template"]["spec"]["containers"][0]["resources"][
        "requests"
    ]
    return requests


def _mebibytes(quantity: str) -> float:
    units = {"Ki": 1 / 1024, "Mi": 1, "Gi": 1024}
    return float(quantity[:-2]) * units[quantity[-2:]]


# Peak RSS measured on `make up` with 100 tasks at once (docs/deployment.md, "Kubernetes"), in MiB.
# The egress proxy's: RSS 90 MiB after 200 requests 50 at once (deploy/k8s/base/runtime.yaml).
SIDECAR_PEAK_RSS_MIB = {"egress": 90}
MEASURED_PEAK_RSS_MIB = {
    "gateway": 82,
    "controller": 70,
    "reasoner": 260,
    "security": 61,
    "runtime": 87,
    "storage": 64,
}


@pytest.mark.parametrize("target", TARGETS)
def test_memory_requests_cover_the_measured_peak(target: str) -> None:
    """Below its real size a pod is the first evicted when a node runs short of memory."""
    assert set(MEASURED_PEAK_RSS_MIB) == set(SERVICES)
    for service, peak in MEASURED_PEAK_RSS_MIB.items():
        requested = _mebibytes(_requests(render(target), service)["memory"])
        assert requested >= 1.2 * peak, f"{target}: {service} requests {requested} MiB"
    for sidecar, peak in SIDECAR_PEAK_RSS_MIB.items():
        pod = _service_workload(render(target), SIDECARS[sidecar])["spec"]["template"]["spec"]
        for container in pod.get("initContainers", []):
            if container["name"].startswith(sidecar):
                requested = _mebibytes(container["resources"]["requests"]["memory"])
                assert requested >= 1.2 * peak, (
                    f"{target}: {container['name']} requests {requested}"
                )


@pytest.mark.parametrize("target", TARGETS)
def test_each_runtime_replica_is_named_for_its_engine(target: str) -> None:
    """Orders go to the replica holding a task's sandbox, by the replica's name: the node's
    when the runtime drives its node's engine (the DaemonSet, the host's socket), the pod's
    when it has its own (the DinD sidecar)."""
    [runtime] = [w for w in workloads(render(target)) if w["metadata"]["name"] == "runtime"]
    [container] = [c for c in runtime["spec"]["template"]["spec"]["containers"]]
    env = {e["name"]: e for e in container.get("env", [])}
    field = env["DECKHANDS_RUNTIME_REPLICA"]["valueFrom"]["fieldRef"]["fieldPath"]
    own_engine = env["DOCKER_HOST"].get("value") == "unix:///var/run/dind/docker.sock"
    assert field == ("metadata.name" if own_engine else "spec.nodeName")
