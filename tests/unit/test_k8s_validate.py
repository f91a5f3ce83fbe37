"""Every object kustomize renders is valid against the Kubernetes API schema.

kubernetes-validate carries the OpenAPI schemas of each release in the package (no network, no
cluster). Strict mode rejects fields the API does not know: the API server would drop such a
field silently (a misspelt `readinessProbe` is no probe at all). Two releases: the oldest this
deployment needs (1.31: PodDisruptionBudget's unhealthyPodEvictionPolicy is GA, native sidecars
are on) and the newest the package knows.

KEDA's ScaledObject is a custom resource with no schema in the package; it is checked against
the fields KEDA documents (https://keda.sh/docs/latest/reference/scaledobject-spec/), strictly,
and the HPA behaviour it hands to the HorizontalPodAutoscaler against the real HPA schema.
"""

from __future__ import annotations

import copy
import socket
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
from k8s_manifests import NAMESPACE, TARGETS, Document, name, render

OLDEST = "1.31.0"
NEWEST = kubernetes_validate.latest_version()
CUSTOM_KINDS = {("keda.sh/v1alpha1", "ScaledObject")}
CLUSTER_SCOPED = {"Namespace", "RuntimeClass"}


def _offline(monkeypatch: pytest.MonkeyPatch) -> None:
    """Any attempt to open a network connection fails the test."""

    def refuse(*args: Any, **kwargs: Any) -> None:
        raise AssertionError(f"validation tried to reach the network: {args}")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)


def _validate(document: Document, version: str) -> None:
    kubernetes_validate.validate(document, version, strict=True)


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("version", [OLDEST, NEWEST])
def test_every_rendered_object_is_valid(
    target: str, version: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    documents = render(target)
    _offline(monkeypatch)
    assert documents
    errors = []
    for document in documents:
        if (document["apiVersion"], document["kind"]) in CUSTOM_KINDS:
            continue  # test_scaled_objects_follow_kedas_spec
        try:
            _validate(document, version)
        except kubernetes_validate.ValidationError as exc:
            where = "/".join(str(p) for p in exc.path)
            errors.append(f"{name(document)} at {where}: {exc.message}")
        except kubernetes_validate.SchemaNotFoundError:
            errors.append(f"{name(document)}: no schema for {document['apiVersion']}")
    assert not errors, "\n".join(errors)


@pytest.mark.parametrize("target", TARGETS)
def test_every_namespaced_object_lands_in_the_deckhands_namespace(target: str) -> None:
    for document in render(target):
        namespace = document["metadata"].get("namespace")
        if document["kind"] in CLUSTER_SCOPED:
            assert namespace is None, name(document)
        else:
            assert namespace == NAMESPACE, f"{target}: {name(document)} in {namespace}"


def test_strict_validation_catches_a_misspelt_field() -> None:
    """The check above can fail: a misplaced field and a wrong type are both rejected."""
    deployment = next(d for d in render("base") if d["kind"] == "Deployment")
    _validate(deployment, NEWEST)
    misspelt = copy.deepcopy(deployment)
    container = misspelt["spec"]["template"]["spec"]["containers"][0]
    container["readinessprobe"] = container.pop("readinessProbe")
    with pytest.raises(kubernetes_validate.ValidationError):
        _validate(misspelt, NEWEST)
    wrong_type = copy.deepcopy(deployment)
    wrong_type["spec"]["replicas"] = "two"
    with pytest.raises(kubernetes_validate.ValidationError):
        _validate(wrong_type, NEWEST)


# --- KEDA ---------------------------------------------------------------------------------------

_REPLICAS = {"type": "integer", "minimum": 0}
SCALED_OBJECT_SCHEMA: dict[str, Any] = {
    "type": "object",
    "additionalProperties": False,
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "properties": {
        "apiVersion": {"const": "keda.sh/v1alpha1"},
        "kind": {"const": "ScaledObject"},
        "metadata": {"type": "object"},
        "spec": {
            "type": "object",
            "additionalProperties": False,
            "required": ["scaleTargetRef", "triggers"],
            "properties": {
                "scaleTargetRef": {
                    "type": "object",
                    "additionalProperties": False,
                    "required": ["name"],
                    "properties": {
                        "apiVersion": {"type": "string"},
                        "kind": {"type": "string"},
                        "name": {"type": "string"},
                        "envSourceContainerName": {"type": "string"},
                    },
                },
                "pollingInterval": {"type": "integer", "minimum": 1},
                "cooldownPeriod": {"type": "integer", "minimum": 0},
                "initialCooldownPeriod": {"type": "integer", "minimum": 0},
                "idleReplicaCount": _REPLICAS,
                "minReplicaCount": _REPLICAS,
                "maxReplicaCount": _REPLICAS,
                "fallback": {
                    "type": "object",
                    "additionalProperties": False,
                    "required": ["failureThreshold", "replicas"],
                    "properties": {
                        "failureThreshold": {"type": "integer", "minimum": 1},
                        "replicas": _REPLICAS,
                    },
                },
                "advanced": {
                    "type": "object",
                    "additionalProperties": False,
                    "properties": {
                        "restoreToOriginalReplicaCount": {"type": "boolean"},
                        "horizontalPodAutoscalerConfig": {
                            "type": "object",
                            "additionalProperties": False,
                            "properties": {
                                "name": {"type": "string"},
                                "behavior": {"type": "object"},  # checked as an HPA's below
                            },
                        },
                    },
                },
                "triggers": {
                    "type": "array",
                    "minItems": 1,
                    "items": {
                        "type": "object",
                        "additionalProperties": False,
                        "required": ["type", "metadata"],
                        "properties": {
                            "type": {"type": "string"},
                            "name": {"type": "string"},
                            "metricType": {"enum": ["AverageValue", "Value", "Utilization"]},
                            "useCachedMetrics": {"type": "boolean"},
                            "authenticationRef": {"type": "object"},
                            # KEDA reads every trigger parameter as a string.
                            "metadata": {
                                "type": "object",
                                "additionalProperties": {"type": "string"},
                            },
                        },
                    },
                },
            },
        },
    },
}

# The nats-jetstream scaler's parameters (https://keda.sh/docs/latest/scalers/nats-jetstream/).
JETSTREAM_TRIGGER = {
    "required": {"natsServerMonitoringEndpoint", "stream", "consumer", "lagThreshold"},
    "optional": {"account", "activationLagThreshold", "useHttps"},
    "integers": {"lagThreshold", "activationLagThreshold"},
}


def scaled_objects(target: str) -> list[Document]:
    return [d for d in render(target) if d["kind"] == "ScaledObject"]


def check_scaled_object(scaled: Document) -> None:
    """Raises jsonschema.ValidationError, kubernetes_validate.ValidationError or AssertionError."""
    jsonschema.validate(scaled, SCALED_OBJECT_SCHEMA)
    spec = scaled["spec"]
    behavior = spec.get("advanced", {}).get("horizontalPodAutoscalerConfig", {}).get("behavior")
    if behavior is not None:
        # KEDA copies it into the HPA it creates: the HPA's own schema decides.
        hpa = {
            "apiVersion": "autoscaling/v2",
            "kind": "HorizontalPodAutoscaler",
            "metadata": {"name": scaled["metadata"]["name"]},
            "spec": {
                "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "x"},
                "maxReplicas": spec.get("maxReplicaCount", 100),
                "behavior": behavior,
            },
        }
        _validate(hpa, OLDEST)
    for trigger in spec["triggers"]:
        assert trigger["type"] == "nats-jetstream", trigger["type"]
        keys = set(trigger["metadata"])
        missing = JETSTREAM_TRIGGER["required"] - keys
        unknown = keys - JETSTREAM_TRIGGER["required"] - JETSTREAM_TRIGGER["optional"]
        assert not missing and not unknown, f"missing {missing}, unknown {unknown}"
        for key in JETSTREAM_TRIGGER["integers"] & keys:
            assert int(trigger["metadata"][key]) > 0, key


def test_prod_scales_with_keda() -> None:
    assert scaled_objects("prod")


@pytest.mark.parametrize("target", TARGETS)
def test_scaled_objects_follow_kedas_spec(target: str) -> None:
    for scaled in scaled_objects(target):
        check_scaled_object(scaled)


def test_the_scaled_object_check_can_fail() -> None:
    good = scaled_objects("prod")[0]
    check_scaled_object(good)
    typo = copy.deepcopy(good)
    typo["spec"]["maxReplicas"] = typo["spec"].pop("maxReplicaCount")  # the HPA's spelling
    with pytest.raises(jsonschema.ValidationError):
        check_scaled_object(typo)
    number = copy.deepcopy(good)
    number["spec"]["triggers"][0]["metadata"]["lagThreshold"] = 32
    with pytest.raises(jsonschema.ValidationError):
        check_scaled_object(number)
    bad_behavior = copy.deepcopy(good)
    bad_behavior["spec"]["advanced"]["horizontalPodAutoscalerConfig"]["behavior"]["scaleDown"][
        "policies"
    ][0]["periodSeconds"] = "60s"
    with pytest.raises(kubernetes_validate.ValidationError):
        check_scaled_object(bad_behavior)
    unknown_parameter = copy.deepcopy(good)
    unknown_parameter["spec"]["triggers"][0]["metadata"]["lag_threshold"] = "5"
    with pytest.raises(AssertionError):
        check_scaled_object(unknown_parameter)
