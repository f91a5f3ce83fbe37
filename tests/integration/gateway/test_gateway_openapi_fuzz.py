"""A bounded schemathesis run against the real gateway's OpenAPI document (/openapi.json): a few
generated requests per operation, valid and invalid, and every answer must be no 5xx and must
match what the document promises (status code, content type, body schema, headers). Requests
carry the tenant's API key (the admin key on /v1/admin), so they reach the routes' own logic."""

from __future__ import annotations

import os
import time
from typing import Any

import httpx
import pytest
import schemathesis
from gateway_doubles import StorageDouble
from hypothesis import HealthCheck, Phase, settings
from schemathesis.checks import (
    content_type_conformance,
    not_a_server_error,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from services.gateway.main import build_app
from services.gateway.settings import GatewaySettings
from tools.api_access import auth_headers

# Per operation; about a dozen operations, so the whole run stays well under a minute.
EXAMPLES_PER_OPERATION = int(os.environ.get("GATEWAY_FUZZ_EXAMPLES", "8"))
CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
    response_headers_conformance,
]


def _document() -> dict[str, Any]:
    # Building the app only wires it (nothing connects): the same document the gateway serves.
    return build_app(GatewaySettings()).openapi()


# Loaded at import, not from a fixture: schemathesis' lazy fixture loading does not work with
# this pytest (it reads a private attribute pytest 9 no longer has).
schema = schemathesis.openapi.from_dict(_document())


def _key_for(case: schemathesis.Case, api_key: str, admin_key: str) -> dict[str, str]:
    return auth_headers(admin_key if case.path.startswith("/v1/admin") else api_key)


def test_the_running_gateway_serves_this_document(gateway_url: str, api_key: str) -> None:
    served = httpx.get(f"{gateway_url}/openapi.json", headers=auth_headers(api_key), timeout=10)
    assert served.json() == _document()
    assert httpx.get(f"{gateway_url}/openapi.json", timeout=10).status_code == 401


@schema.parametrize()
@settings(
    max_examples=EXAMPLES_PER_OPERATION,
    deadline=None,
    # The same requests every run, so that a failure is reproducible; GATEWAY_FUZZ_RANDOM=1
    # explores (with GATEWAY_FUZZ_EXAMPLES=100, say).
    derandomize="GATEWAY_FUZZ_RANDOM" not in os.environ,
    phases=[Phase.explicit, Phase.generate],
    suppress_health_check=list(HealthCheck),
)
@pytest.mark.timeout(60)
def test_every_operation_answers_as_documented(
    case: schemathesis.Case, gateway_url: str, storage: StorageDouble, api_key: str, admin_key: str
) -> None:
    case.call_and_validate(
        base_url=gateway_url,
        checks=CHECKS,
        timeout=10,
        headers=_key_for(case, api_key, admin_key),
    )


@pytest.mark.timeout(60)
def test_a_reused_idempotency_key_is_answered_as_documented(
    gateway_url: str, storage: StorageDouble, api_key: str
) -> None:
    """Reached only by sending the same key twice, which generated requests do not do."""
    create = schema["/v1/tasks"]["POST"]
    key = f"fuzz-reused-{time.time_ns()}"
    for task, status in (("first task", 202), ("another task", 422)):
        case = create.Case(body={"task": task}, headers={"Idempotency-Key": key})
        response = case.call_and_validate(
            base_url=gateway_url, checks=CHECKS, timeout=10, headers=auth_headers(api_key)
        )
        assert response.status_code == status, response.text
