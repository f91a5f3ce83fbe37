"""The deployment files parse, agree with the code, and keep the safety properties they claim.

Services are discovered (services/<name>/main.py), so a new service without a deployment fails
here. `docker-compose config` and `kubectl kustomize` run when those tools are installed.
"""

from __future__ import annotations

import importlib
import inspect
import os
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic_settings import BaseSettings

from shared.subjects import Service

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
# The kustomize base; overlays and components sit next to it (deploy/k8s/kustomization.yaml).
K8S = DEPLOY / "k8s" / "base"
COMPOSE = DEPLOY / "compose.yml"
DOCKERFILE = DEPLOY / "service" / "Dockerfile"
SERVICE_IMAGE = "deckhands/service"
# The egress proxy's image (deploy/egress/Dockerfile): mitmproxy needs a Python of its own.
EGRESS_IMAGE = "deckhands/egress"
WORKLOAD_KINDS = {"Deployment", "StatefulSet"}
# Not deckhands services, but run from the same image.
TOOL_MODULES = {"tools.scripted_llm"}


def services() -> list[str]:
    return sorted(p.parent.name for p in (ROOT / "services").glob("*/main.py"))


# --- Kubernetes ------------------------------------------------------------------------------


def k8s_documents() -> list[dict[str, Any]]:
    kustomization = yaml.safe_load((K8S / "kustomization.yaml").read_text())
    documents = []
    for resource in kustomization["resources"]:
        for document in yaml.safe_load_all((K8S / resource).read_text()):
            if document is not None:
                documents.append(document)
    return documents


def workloads() -> list[dict[str, Any]]:
    return [d for d in k8s_documents() if d["kind"] in WORKLOAD_KINDS]


def pod_spec(workload: dict[str, Any]) -> dict[str, Any]:
    spec: dict[str, Any] = workload["spec"]["template"]["spec"]
    return spec


def long_running_containers(workload: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """Containers plus native sidecars (init containers with restartPolicy Always)."""
    spec = pod_spec(workload)
    yield from spec["containers"]
    for init in spec.get("initContainers", []):
        if init.get("restartPolicy") == "Always":
            yield init


def deckhands_module(container: dict[str, Any]) -> str | None:
    """The `python -m` module a deckhands/service container runs (its first argument)."""
    if container["image"].split(":")[0] not in (SERVICE_IMAGE, EGRESS_IMAGE):
        return None
    args = container.get("args") or []
    return str(args[0]) if args else None


def _name(document: dict[str, Any]) -> str:
    return f"{document['kind']}/{document['metadata']['name']}"


def test_every_yaml_file_parses() -> None:
    files = sorted(DEPLOY.rglob("*.yaml")) + sorted(DEPLOY.rglob("*.yml"))
    assert files
    for path in files:
        documents = [d for d in yaml.safe_load_all(path.read_text()) if d is not None]
        assert documents, f"{path} is empty"


def test_kustomization_lists_every_manifest() -> None:
    listed = set(yaml.safe_load((K8S / "kustomization.yaml").read_text())["resources"])
    on_disk = {p.name for p in K8S.glob("*.yaml")} - {"kustomization.yaml"}
    assert listed == on_disk


def test_every_service_is_deployed_on_kubernetes() -> None:
    modules = (deckhands_module(c) for w in workloads() for c in long_running_containers(w))
    deployed = {m for m in modules if m is not None}
    missing = {f"services.{s}" for s in services()} - deployed
    assert not missing, f"no Deployment/StatefulSet runs {sorted(missing)}"
    # Services being written may lack main.py yet; the names must still be real services.
    known = {f"services.{s.value}" for s in Service} | {f"services.{s}" for s in services()}
    unknown = deployed - known - TOOL_MODULES
    assert not unknown, f"manifests run modules that are no service: {sorted(unknown)}"


@pytest.mark.parametrize("workload", workloads(), ids=_name)
def test_workload_has_probes_resources_and_a_safe_security_context(
    workload: dict[str, Any],
) -> None:
    spec = pod_spec(workload)
    assert spec.get("automountServiceAccountToken") is False, "pods need no API token"
    pod_security = spec.get("securityContext", {})
    for container in long_running_containers(workload):
        where = f"{_name(workload)} container {container['name']}"
        assert "livenessProbe" in container, f"{where}: no livenessProbe"
        if container in spec["containers"]:
            assert "readinessProbe" in container, f"{where}: no readinessProbe"
        for bound in ("requests", "limits"):
            assert {"cpu", "memory"} <= set(container["resources"][bound]), f"{where}: {bound}"
        security = container.get("securityContext", {})
        if security.get("privileged"):
            # Only the Docker-in-Docker engine next to the runtime may be privileged.
            assert (workload["metadata"]["name"], container["name"]) == ("runtime", "dind")
            continue
        non_root = security.get("runAsNonRoot", pod_security.get("runAsNonRoot"))
        assert non_root is True, f"{where}: runAsNonRoot"
        assert security.get("allowPrivilegeEscalation") is False, f"{where}: privilege escalation"
        assert security.get("readOnlyRootFilesystem") is True, f"{where}: writable root fs"
        assert security.get("capabilities", {}).get("drop") == ["ALL"], f"{where}: capabilities"


@pytest.mark.parametrize("workload", workloads(), ids=_name)
def test_probes_and_scrape_annotations_name_real_ports(workload: dict[str, Any]) -> None:
    containers = list(long_running_containers(workload))
    ports = {p["name"]: p["containerPort"] for c in containers for p in c.get("ports", [])}
    for container in containers:
        for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
            action = container.get(probe, {}).get("httpGet") or container.get(probe, {}).get(
                "tcpSocket"
            )
            if action:
                port = action["port"]
                assert port in ports or port in ports.values(), f"{probe} port {port}"
    annotations = workload["spec"]["template"]["metadata"].get("annotations", {})
    if annotations.get("prometheus.io/scrape") == "true":
        assert int(annotations["prometheus.io/port"]) in ports.values()


def test_python_services_are_scraped_on_the_metrics_port() -> None:
    settings = next(d for d in k8s_documents() if d["kind"] == "ConfigMap")
    metrics_port = int(settings["data"]["DECKHANDS_METRICS_PORT"])
    assert metrics_port == 9100
    for workload in workloads():
        modules = {deckhands_module(c) for c in pod_spec(workload)["containers"]}
        if not any(m and m.startswith("services.") for m in modules):
            continue
        annotations = workload["spec"]["template"]["metadata"]["annotations"]
        assert annotations["prometheus.io/scrape"] == "true", _name(workload)
        if "services.gateway" not in modules:  # the gateway serves /metrics on its HTTP port
            assert int(annotations["prometheus.io/port"]) == metrics_port, _name(workload)


PROBE_PATHS = {"startupProbe": "/healthz", "livenessProbe": "/healthz", "readinessProbe": "/readyz"}


def test_every_service_is_probed_on_its_health_endpoints() -> None:
    """/metrics answering says nothing about NATS or the consumers (shared/health.py does)."""
    probed = set()
    for workload in workloads():
        for container in long_running_containers(workload):
            module = deckhands_module(container)
            if not module or not module.startswith("services."):
                continue
            probed.add(module)
            where = f"{_name(workload)} container {container['name']}"
            port = "http" if module == "services.gateway" else "metrics"
            if module == "services.egress":  # sidecars of one pod: a port each
                port = container["name"]
            for probe, path in PROBE_PATHS.items():
                assert probe in container, f"{where}: no {probe}"
                action = container[probe].get("httpGet")
                assert action, f"{where}: {probe} is not an HTTP probe"
                assert (action["path"], action["port"]) == (path, port), f"{where}: {probe}"
                # A worker's own deadline for its event loop (1.5 s) must fit in the probe's.
                assert container[probe].get("timeoutSeconds", 1) >= 2, f"{where}: {probe} timeout"
    assert probed == {f"services.{s}" for s in services()}
    healthcheck = yaml.safe_load(COMPOSE.read_text())["x-metrics-healthcheck"]["test"]
    assert "/readyz" in healthcheck[-1]


def test_services_select_workloads_and_their_ports() -> None:
    documents = k8s_documents()
    for service in (d for d in documents if d["kind"] == "Service"):
        selector = service["spec"]["selector"]
        targets = [
            w
            for w in documents
            if w["kind"] in WORKLOAD_KINDS
            and selector.items() <= w["spec"]["template"]["metadata"]["labels"].items()
        ]
        assert targets, f"{_name(service)} selects no workload"
        ports = {
            p["name"]
            for w in targets
            for c in long_running_containers(w)
            for p in c.get("ports", [])
        }
        for port in service["spec"]["ports"]:
            target = port.get("targetPort", port["port"])
            assert isinstance(target, int) or target in ports, f"{_name(service)}: {target}"


def test_stateful_parts_keep_their_data_on_volume_claims() -> None:
    by_name = {w["metadata"]["name"]: w for w in workloads()}
    for name in ("nats", "redis", "storage"):
        workload = by_name[name]
        assert workload["kind"] == "StatefulSet", name
        claims = {t["metadata"]["name"] for t in workload["spec"]["volumeClaimTemplates"]}
        mounts = {m["name"] for c in pod_spec(workload)["containers"] for m in c["volumeMounts"]}
        assert claims & mounts, f"{name} does not mount its volume claim"
    # NATS reads its configuration (ConfigMap nats-config): JetStream's store on the claim.
    nats = pod_spec(by_name["nats"])["containers"][0]
    assert nats["args"] == ["-c", "/etc/nats/nats.conf"]
    config = next(d for d in k8s_documents() if d["metadata"]["name"] == "nats-config")
    store = re.search(r"jetstream \{\s*store_dir: (\S+)", config["data"]["nats.conf"])
    data_mount = next(m["mountPath"] for m in nats["volumeMounts"] if m["name"] == "data")
    assert store and store.group(1).startswith(data_mount + "/"), config["data"]["nats.conf"]
    redis_args = pod_spec(by_name["redis"])["containers"][0]["args"]
    assert redis_args[redis_args.index("--appendonly") + 1] == "yes"


def test_runtime_reaches_docker_through_a_private_socket_only() -> None:
    runtime = next(w for w in workloads() if w["metadata"]["name"] == "runtime")
    spec = pod_spec(runtime)
    dind = next(c for c in spec["initContainers"] if c["name"] == "dind")
    assert dind["restartPolicy"] == "Always"
    assert not any(a.startswith("--host=tcp") for a in dind["args"]), "dockerd must not listen"
    env = {e["name"]: e.get("value") for e in spec["containers"][0]["env"]}
    assert env["DOCKER_HOST"].startswith("unix://")
    # No other workload can reach a Docker engine.
    for workload in workloads():
        if workload["metadata"]["name"] == "runtime":
            continue
        text = yaml.safe_dump(workload)
        assert "docker.sock" not in text and "DOCKER_HOST" not in text, _name(workload)


def test_llm_key_comes_from_a_secret_reference_only() -> None:
    for document in k8s_documents():
        if document["kind"] == "Secret":
            # The base's Secrets are the gateway's admin key, the secrets key and the egress
            # CA, shipped empty: an overlay sets them (gateway-secret.yaml, secrets-key.yaml,
            # egress-ca.yaml); no value is baked in.
            assert document["metadata"]["name"] in (
                "deckhands-gateway-admin",
                "deckhands-secrets-key",
                "deckhands-egress-ca",
            ), _name(document)
            assert set(document["stringData"].values()) == {""}, "a secret value in the base"
            assert "data" not in document
        text = yaml.safe_dump(document)
        assert "LLM_API_KEY" not in text or "secretKeyRef" in text, _name(document)


def _settings_fields(service: str) -> set[str] | None:
    """DECKHANDS_* names a service reads, or None when it has no settings module yet."""
    try:
        module = importlib.import_module(f"services.{service}.settings")
    except ModuleNotFoundError:
        return None
    classes = [
        obj
        for obj in vars(module).values()
        if inspect.isclass(obj)
        and issubclass(obj, BaseSettings)
        and obj.__module__ == module.__name__
    ]
    names = set()
    for cls in classes:
        prefix = str(cls.model_config.get("env_prefix") or "DECKHANDS_")
        for name, field in cls.model_fields.items():
            alias = field.validation_alias
            names.add(alias if isinstance(alias, str) else f"{prefix}{name.upper()}")
    return names


def _container_env(container: dict[str, Any]) -> set[str]:
    return {e["name"] for e in container.get("env", []) if e["name"].startswith("DECKHANDS_")}


def test_deckhands_variables_are_settings_the_services_read() -> None:
    """A misspelt variable would be silently ignored (extra="ignore"): catch it here."""
    known: dict[str, set[str]] = {}
    for service in services():
        fields = _settings_fields(service)
        if fields is not None:
            known[service] = fields
    everything = set().union(*known.values())
    configmap = next(d for d in k8s_documents() if d["kind"] == "ConfigMap")
    for name in configmap["data"]:
        if name.startswith("DECKHANDS_"):
            assert name in everything, f"configmap sets {name}, which no service reads"
    for workload in workloads():
        for container in long_running_containers(workload):
            module = deckhands_module(container) or ""
            service = module.removeprefix("services.")
            if service in known:
                unknown = _container_env(container) - known[service]
                assert not unknown, f"{_name(workload)} sets {sorted(unknown)}: not read"
    compose = yaml.safe_load(COMPOSE.read_text())["services"]
    for service, fields in known.items():
        if service in compose:
            environment = compose[service].get("environment", {})
            unknown = {k for k in environment if k.startswith("DECKHANDS_")} - fields
            assert not unknown, f"compose service {service} sets {sorted(unknown)}: not read"


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl is not installed")
def test_kustomize_builds_the_base_and_the_host_docker_component(tmp_path: Path) -> None:
    base = subprocess.run(
        ["kubectl", "kustomize", str(K8S)], capture_output=True, text=True, check=False
    )
    assert base.returncode == 0, base.stderr
    built = [d for d in yaml.safe_load_all(base.stdout) if d]
    assert len(built) == len(k8s_documents())
    assert {d["metadata"].get("namespace") for d in built if d["kind"] != "Namespace"} == {
        "deckhands"
    }

    overlay = tmp_path / "overlay"
    overlay.mkdir()
    base_path = os.path.relpath(K8S, overlay)  # kustomize refuses absolute paths
    (overlay / "kustomization.yaml").write_text(
        yaml.safe_dump(
            {
                "resources": [base_path],
                "components": [
                    os.path.relpath(K8S.parent / "components" / "host-docker-socket", overlay)
                ],
            }
        )
    )
    result = subprocess.run(
        ["kubectl", "kustomize", str(overlay)], capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stderr
    runtime = next(
        d
        for d in yaml.safe_load_all(result.stdout)
        if d and d["kind"] == "Deployment" and d["metadata"]["name"] == "runtime"
    )
    spec = pod_spec(runtime)
    sidecars = {c["name"] for c in spec.get("initContainers", [])}
    assert sidecars == {"egress-0", "egress-1"}, "the DinD sidecar is gone, the egress proxy's not"
    [egress] = [v for v in spec["volumes"] if v["name"] == "egress"]
    assert egress["hostPath"]["path"] == "/var/run/deckhands-egress", "the node's engine mounts it"
    assert spec["nodeSelector"] == {"deckhands.dev/sandbox-node": "true"}
    mounts = {m["mountPath"] for m in spec["containers"][0]["volumeMounts"]}
    assert "/var/run/docker.sock" in mounts and "/var/run/dind" not in mounts


# --- docker-compose ---------------------------------------------------------------------------


def compose_services() -> dict[str, Any]:
    services_: dict[str, Any] = yaml.safe_load(COMPOSE.read_text())["services"]
    return services_


def test_compose_runs_every_service_with_a_healthcheck() -> None:
    compose = compose_services()
    for service in services():
        assert service in compose, f"deploy/compose.yml has no {service}"
        assert compose[service]["command"] == [f"services.{service}"]
    for name, service in compose.items():
        assert "healthcheck" in service, f"compose service {name} has no healthcheck"


def test_compose_gives_the_docker_socket_to_the_runtime_only() -> None:
    for name, service in compose_services().items():
        mounts_socket = any("docker.sock" in str(v) for v in service.get("volumes", []))
        assert mounts_socket == (name == "runtime"), name


def test_compose_keeps_nats_and_redis_data_on_volumes() -> None:
    compose = compose_services()
    assert "-js" in compose["nats"]["command"]
    assert any(str(v).startswith("nats-data:") for v in compose["nats"]["volumes"])
    redis_command = compose["redis"]["command"]
    assert redis_command[redis_command.index("--appendonly") + 1] == "yes"
    assert any(str(v).startswith("redis-data:") for v in compose["redis"]["volumes"])


@pytest.mark.skipif(shutil.which("docker-compose") is None, reason="docker-compose is missing")
def test_compose_config_validates() -> None:
    result = subprocess.run(
        ["docker-compose", "-f", str(COMPOSE), "config", "-q"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stderr


# --- the image --------------------------------------------------------------------------------


def test_dockerfile_runs_as_a_numeric_non_root_user_without_secrets() -> None:
    text = DOCKERFILE.read_text()
    assert re.search(r"^ARG BASE_IMAGE=python:3\.12-slim$", text, re.M)
    users = re.findall(r"^USER\s+(\S+)", text, re.M)
    assert users and users[-1].split(":")[0] == "10001"
    for line in re.findall(r"^(?:ENV|ARG)\s.*$", text, re.M):
        assert not re.search(r"(?i)(api_?key|secret|token|password)", line), line


def test_build_scripts_are_valid_bash() -> None:
    for script in DEPLOY.rglob("build.sh"):
        result = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True)
        assert result.returncode == 0, f"{script}: {result.stderr}"
