"""Rendering deploy/k8s with kubectl kustomize, shared by the tests/unit/test_k8s_*.py modules.

Every test looks at what `kubectl apply -k` would send, not at the source files, so patches,
components and overlays are part of what is checked.
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
K8S = ROOT / "deploy" / "k8s"
COMPONENTS = K8S / "components"
NAMESPACE = "deckhands"

# What an operator installs: the base as it is, the two overlays, and the base with each
# opt-in component (rendered through a throwaway overlay, as an operator's own would).
TARGETS = (
    "base",
    "prod",
    "dev",
    "base+hpa-cpu",
    "base+host-docker-socket",
    "base+gvisor-sandbox-nodes",
)

Document = dict[str, Any]


def kubectl() -> str:
    path = shutil.which("kubectl")
    assert path, "kubectl is missing: `make system-packages` installs it"
    return path


def _kustomize(directory: Path) -> list[Document]:
    result = subprocess.run(
        [kubectl(), "kustomize", str(directory)],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert result.returncode == 0, f"kubectl kustomize {directory}: {result.stderr}"
    return [d for d in yaml.safe_load_all(result.stdout) if d]


@functools.cache
def render(target: str) -> tuple[Document, ...]:
    """The objects of one target of TARGETS (cached: kustomize runs once per target)."""
    if target == "base":
        return tuple(_kustomize(K8S))
    if target in ("prod", "dev"):
        return tuple(_kustomize(K8S / "overlays" / target))
    base, _, component = target.partition("+")
    assert base == "base" and (COMPONENTS / component).is_dir(), target
    with tempfile.TemporaryDirectory() as tmp:
        overlay = Path(tmp)
        # kustomize refuses absolute paths to resources and components.
        (overlay / "kustomization.yaml").write_text(
            yaml.safe_dump(
                {
                    "namespace": NAMESPACE,
                    "resources": [os.path.relpath(K8S / "base", overlay)],
                    "components": [os.path.relpath(COMPONENTS / component, overlay)],
                }
            )
        )
        return tuple(_kustomize(overlay))


def name(document: Document) -> str:
    return f"{document['kind']}/{document['metadata']['name']}"


def of_kind(documents: tuple[Document, ...], *kinds: str) -> list[Document]:
    return [d for d in documents if d["kind"] in kinds]


def by_name(documents: tuple[Document, ...], kind: str) -> dict[str, Document]:
    return {d["metadata"]["name"]: d for d in of_kind(documents, kind)}


def workloads(documents: tuple[Document, ...]) -> list[Document]:
    return of_kind(documents, "Deployment", "StatefulSet", "DaemonSet")


def pod_labels(workload: Document) -> dict[str, str]:
    labels: dict[str, str] = workload["spec"]["template"]["metadata"]["labels"]
    return labels


def containers(workload: Document) -> Iterator[Document]:
    spec = workload["spec"]["template"]["spec"]
    yield from spec.get("initContainers", [])
    yield from spec["containers"]


def container_ports(workload: Document) -> dict[str, int]:
    """Port name -> number of every container (named or not: unnamed ones by their number)."""
    ports: dict[str, int] = {}
    for container in containers(workload):
        for port in container.get("ports", []):
            ports[port.get("name", str(port["containerPort"]))] = port["containerPort"]
    return ports


def matches(selector: Document | None, labels: dict[str, str]) -> bool:
    """A Kubernetes label selector (matchLabels and matchExpressions) applied to labels."""
    if selector is None:
        return False
    for key, value in (selector.get("matchLabels") or {}).items():
        if labels.get(key) != value:
            return False
    for expression in selector.get("matchExpressions") or []:
        key, operator = expression["key"], expression["operator"]
        values = expression.get("values") or []
        present = key in labels
        ok = {
            "In": present and labels.get(key) in values,
            "NotIn": not present or labels.get(key) not in values,
            "Exists": present,
            "DoesNotExist": not present,
        }[operator]
        if not ok:
            return False
    return True
