"""The NetworkPolicies allow exactly the flows of the architecture, nothing more.

The rendered policies are evaluated as Kubernetes does (a pod selected by no policy of a
direction is open in it; otherwise some rule of a selecting policy must allow the peer and the
port; a connection needs the sender's egress and the receiver's ingress) over every pair of
the namespace's pods, a few pods elsewhere (Prometheus, KEDA, cluster DNS, a stranger), and
public and private addresses, each way. The result must equal EXPECTED, flow for flow.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field

import pytest
from k8s_manifests import (
    NAMESPACE,
    TARGETS,
    Document,
    container_ports,
    matches,
    pod_labels,
    render,
    workloads,
)


@dataclass(frozen=True)
class Peer:
    name: str
    namespace: str | None = None  # None: an address outside the cluster
    labels: tuple[tuple[str, str], ...] = ()
    ip: str = ""
    ports: frozenset[tuple[str, int]] = field(default_factory=frozenset)

    @property
    def label_dict(self) -> dict[str, str]:
        return dict(self.labels)


def _tcp(*ports: int) -> frozenset[tuple[str, int]]:
    return frozenset(("TCP", p) for p in ports)


OUTSIDE_PODS = (
    Peer(
        "prometheus",
        "monitoring",
        (("app.kubernetes.io/name", "prometheus"),),
        "10.9.0.1",
        _tcp(9090),
    ),
    Peer("keda", "keda", (("app", "keda-operator"),), "10.9.0.2", _tcp(8080)),
    Peer(
        "dns",
        "kube-system",
        (("k8s-app", "kube-dns"),),
        "10.9.0.3",
        frozenset({("UDP", 53), ("TCP", 53)}),
    ),
    Peer("stranger", "default", (("app", "web"),), "10.9.0.4", _tcp(8080)),
)
ADDRESSES = (
    Peer("internet", None, (), "203.0.113.7", _tcp(22, 80, 443)),
    Peer("private-net", None, (), "10.20.30.40", _tcp(443, 2376, 5432)),
    Peer("cloud-metadata", None, (), "169.254.169.254", _tcp(80)),
)
WORKERS = ("controller", "reasoner", "security", "runtime", "storage")
SERVICES = ("gateway", *WORKERS)

# (from, to, port) for every connection the architecture has; "dns" is the cluster DNS.
_BASE = (
    {(p.name, "gateway", 8000) for p in (*OUTSIDE_PODS, *ADDRESSES)}  # the API, from anywhere
    | {("prometheus", w, 9100) for w in WORKERS}  # metrics (the gateway's are on 8000)
    | {("prometheus", "nats", 8222)}  # NATS' monitor, for an exporter
    | {(s, "nats", 4222) for s in SERVICES}
    | {(s, "redis", 6379) for s in ("gateway", "controller", "reasoner", "runtime")}
    | {("reasoner", "scripted-llm", 9000), ("reasoner", "internet", 443)}
    | {("gateway", "internet", p) for p in (80, 443)}  # webhooks
    | {("runtime", "internet", p) for p in (22, 80, 443)}  # image pulls, opted-in sandboxes
    | {("nats", "nats", 6222)}  # cluster routes
)
# On gVisor sandbox nodes the runtime reaches its node's engine (a private address, mutual TLS
# on 2376); image pulls and sandbox traffic leave from that engine, not from the runtime pod.
# The nodes' egress proxies (on each node's engine, in its network) reach NATS and Redis from
# the node's private address.
_SANDBOX_NODES = {f for f in _BASE if f[:2] != ("runtime", "internet")} | {
    ("runtime", "private-net", 2376),
    ("private-net", "nats", 4222),
    ("private-net", "redis", 6379),
}
EXPECTED = {
    "base": _BASE,
    "dev": _BASE,
    "base+hpa-cpu": _BASE,
    "base+host-docker-socket": _BASE,
    "base+gvisor-sandbox-nodes": _SANDBOX_NODES,
    # No scripted server; KEDA reads the consumers' backlog from NATS' monitor.
    "prod": {f for f in _SANDBOX_NODES if "scripted-llm" not in f} | {("keda", "nats", 8222)},
}


def _inside(documents: tuple[Document, ...]) -> list[Peer]:
    numbered = set()
    for policy in _policies(documents):
        for direction in ("ingress", "egress"):
            for rule in policy["spec"].get(direction, []):
                numbered |= {p["port"] for p in rule.get("ports", []) if isinstance(p["port"], int)}
    pods = []
    for index, workload in enumerate(workloads(documents)):
        ports = set(container_ports(workload).values()) | numbered
        pods.append(
            Peer(
                workload["metadata"]["name"],
                NAMESPACE,
                tuple(sorted(pod_labels(workload).items())),
                f"10.8.0.{index + 1}",
                _tcp(*ports),
            )
        )
    return pods


def _policies(documents: tuple[Document, ...]) -> list[Document]:
    return [d for d in documents if d["kind"] == "NetworkPolicy"]


def _peer_matches(element: Document, peer: Peer) -> bool:
    if "ipBlock" in element:
        if peer.namespace is not None:
            return False  # pod addresses are the CNI's; none of ours is in a public block
        block = element["ipBlock"]
        address = ipaddress.ip_address(peer.ip)
        return address in ipaddress.ip_network(block["cidr"]) and not any(
            address in ipaddress.ip_network(e) for e in block.get("except", [])
        )
    if peer.namespace is None:
        return False
    namespace_selector = element.get("namespaceSelector")
    if namespace_selector is None:
        in_namespace = peer.namespace == NAMESPACE
    else:
        in_namespace = matches(namespace_selector, {"kubernetes.io/metadata.name": peer.namespace})
    pod_selector = element.get("podSelector")
    return in_namespace and (pod_selector is None or matches(pod_selector, peer.label_dict))


def _port_matches(
    rule: Document, target: Peer, port: tuple[str, int], named: dict[str, int]
) -> bool:
    if not rule.get("ports"):
        return True
    protocol, number = port
    for allowed in rule["ports"]:
        value = allowed.get("port")
        if allowed.get("protocol", "TCP") != protocol:
            continue
        if value is None or value == number or named.get(str(value)) == number:
            return True
    return False


def _allowed(
    documents: tuple[Document, ...], pod: Peer, direction: str, peer: Peer, port: tuple[str, int]
) -> bool:
    """Whether `pod`'s policies let it talk to `peer` (egress) or hear from it (ingress)."""
    if pod.namespace != NAMESPACE:
        return True  # pods elsewhere: not ours to restrict
    kind = {"ingress": "Ingress", "egress": "Egress"}[direction]
    selecting = [
        p
        for p in _policies(documents)
        if matches(p["spec"]["podSelector"], pod.label_dict) or p["spec"]["podSelector"] == {}
    ]
    selecting = [p for p in selecting if kind in p["spec"].get("policyTypes", ["Ingress"])]
    if not selecting:
        return True
    workload = {w["metadata"]["name"]: w for w in workloads(documents)}
    receiver = pod if direction == "ingress" else peer
    named = container_ports(workload[receiver.name]) if receiver.namespace == NAMESPACE else {}
    key = "from" if direction == "ingress" else "to"
    for policy in selecting:
        for rule in policy["spec"].get(direction, []):
            peers_ok = key not in rule or any(_peer_matches(e, peer) for e in rule[key])
            if peers_ok and _port_matches(rule, receiver, port, named):
                return True
    return False


def allowed_flows(documents: tuple[Document, ...]) -> set[tuple[str, str, int]]:
    inside = _inside(documents)
    flows = set()
    for source in (*inside, *OUTSIDE_PODS, *ADDRESSES):
        for target in (*inside, *OUTSIDE_PODS, *ADDRESSES):
            if source.namespace != NAMESPACE and target.namespace != NAMESPACE:
                continue  # neither end is ours
            for port in target.ports:
                if _allowed(documents, source, "egress", target, port) and (
                    target.namespace is None or _allowed(documents, target, "ingress", source, port)
                ):
                    flows.add((source.name, target.name, port[1]))
    return flows


@pytest.mark.parametrize("target", TARGETS)
def test_policies_allow_exactly_the_architectures_flows(target: str) -> None:
    documents = render(target)
    pods = {w["metadata"]["name"] for w in workloads(documents)}
    flows = allowed_flows(documents)
    dns = {(pod, "dns", 53) for pod in pods}
    assert dns <= flows, f"{target}: no DNS for {sorted(p for p, _, _ in dns - flows)}"
    flows -= dns
    expected = {
        f
        for f in EXPECTED[target]
        if {f[0], f[1]} <= pods | {p.name for p in (*OUTSIDE_PODS, *ADDRESSES)}
    }
    assert not flows - expected, (
        f"{target}: flows the architecture lacks: {sorted(flows - expected)}"
    )
    assert not expected - flows, f"{target}: flows blocked: {sorted(expected - flows)}"


@pytest.mark.parametrize("target", TARGETS)
def test_every_pod_is_under_default_deny(target: str) -> None:
    documents = render(target)
    deny = [
        p
        for p in _policies(documents)
        if p["spec"]["podSelector"] == {}
        and set(p["spec"]["policyTypes"]) == {"Ingress", "Egress"}
        and not p["spec"].get("ingress")
        and not p["spec"].get("egress")
    ]
    assert deny, f"{target}: no default-deny policy"


def test_prometheus_reaches_every_scraped_port() -> None:
    """The scrape annotations and the policies name the same ports."""
    documents = render("base")
    flows = allowed_flows(documents)
    for workload in workloads(documents):
        annotations = workload["spec"]["template"]["metadata"].get("annotations", {})
        if annotations.get("prometheus.io/scrape") == "true":
            port = int(annotations["prometheus.io/port"])
            assert ("prometheus", workload["metadata"]["name"], port) in flows


def test_the_evaluator_sees_an_opened_hole() -> None:
    """A policy allowing everything into Redis shows up as flows the architecture lacks."""
    documents = render("base")
    hole = {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {"name": "hole", "namespace": NAMESPACE},
        "spec": {
            "podSelector": {"matchLabels": {"app.kubernetes.io/name": "redis"}},
            "policyTypes": ["Ingress"],
            "ingress": [{}],
        },
    }
    opened = allowed_flows((*documents, hole)) - allowed_flows(documents)
    assert ("stranger", "redis", 6379) in opened
    # Ingress alone is not enough: the security monitor's egress still stops it.
    assert ("security", "redis", 6379) not in opened
