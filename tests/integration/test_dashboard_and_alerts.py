"""The dashboard and the alert rules against real data: a real Prometheus (Debian's binary) on
loopback scrapes a running stack (the gateway's /metrics and every worker's metrics port) every
second while a few tasks run on the scripted LLM; then every panel and alert expression is run
through Prometheus' HTTP API. Each must be valid, the golden-signal panels must show data, and
no label stored by Prometheus may carry a task id or other unbounded value."""

from __future__ import annotations

import io
import json
import re
import shutil
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from tools.procs import free_port, wait_for_port
from tools.run_task import SEED_TASK, run_task
from tools.stack import Stack, StackConfig, running

pytestmark = pytest.mark.docker

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
DASHBOARD = DEPLOY / "grafana" / "deckhands.json"
ALERTS = DEPLOY / "prometheus" / "alerts.yml"
TASKS = 3
# Grafana fills these in; a window of a minute covers the tasks just run.
GRAFANA_VARIABLES = {"$__rate_interval": "1m", "$__interval": "15s", "$__range": "5m"}
# The golden signals: on a stack that just ran tasks these show a value above zero.
GOLDEN_PANELS = (
    "Tasks created per minute",
    "Tasks ended per minute, by end state",
    "Task duration",
    "Controller turn (p50, p95)",
    "LLM latency by model (p95)",
    "Runtime action by kind (p95)",
    "LLM calls per minute, by model and outcome",
)
# A task, action, event or message id (32 hex digits, or a UUID's 8-4-4-4-12).
AN_ID = re.compile(r"[0-9a-f]{32}|[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
# Labels that name a scrape target, not something a metric counts.
TARGET_LABELS = {"__name__", "instance", "job"}


@dataclass
class Scraped:
    stack: Stack
    prometheus: str  # its base URL


def _scrape_config(config: StackConfig, rules: Path) -> dict[str, Any]:
    targets = {"gateway": config.gateway_port, **config.metrics_ports}
    return {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(rules)],
        "scrape_configs": [
            {
                "job_name": f"deckhands-{name}",
                "static_configs": [{"targets": [f"127.0.0.1:{port}"]}],
            }
            for name, port in targets.items()
        ],
    }


def _start_prometheus(config: StackConfig, root: Path) -> tuple[subprocess.Popen[bytes], int]:
    binary = shutil.which("prometheus")
    if binary is None:
        pytest.fail("prometheus not found: `make system-packages` installs Debian's prometheus")
    port = free_port()
    # JSON is YAML: the config needs no YAML writer.
    (root / "prometheus.yml").write_text(json.dumps(_scrape_config(config, ALERTS)))
    with (root / "prometheus.log").open("wb") as log:
        proc = subprocess.Popen(
            [
                binary,
                f"--config.file={root / 'prometheus.yml'}",
                f"--storage.tsdb.path={root / 'data'}",
                f"--web.listen-address=127.0.0.1:{port}",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    wait_for_port(port, timeout_s=20, proc=proc)
    return proc, port


def _wait_all_targets_up(prometheus: str, expected: int, timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        targets = httpx.get(f"{prometheus}/api/v1/targets", timeout=5).json()["data"]
        health = [t["health"] for t in targets["activeTargets"]]
        if len(health) == expected and all(h == "up" for h in health):
            return
        assert time.monotonic() < deadline, f"targets not all up: {targets['activeTargets']}"
        time.sleep(0.5)


@pytest.fixture(scope="module")
def scraped(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Scraped]:
    config = StackConfig.isolated(
        Path(tmp_path_factory.mktemp("stack")), extra_env={"DECKHANDS_POOL_MIN_IDLE": "1"}
    )
    with running(config) as stack:
        proc, port = _start_prometheus(config, Path(tmp_path_factory.mktemp("prometheus")))
        prometheus = f"http://127.0.0.1:{port}"
        try:
            _wait_all_targets_up(prometheus, expected=1 + len(config.metrics_ports))
            for _ in range(TASKS):
                result = run_task(
                    config.gateway_url,
                    SEED_TASK,
                    timeout_s=60,
                    out=io.StringIO(),
                    api_key=stack.api_key,
                )
                assert result["state"] == "FINISHED", result
            # The consumer gauges refresh every 5 s; a few scrapes after that.
            time.sleep(6)
            yield Scraped(stack, prometheus)
        finally:
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def _query(prometheus: str, expr: str) -> list[dict[str, Any]]:
    answer = httpx.get(f"{prometheus}/api/v1/query", params={"query": expr}, timeout=10)
    body = answer.json()
    assert answer.status_code == 200 and body["status"] == "success", f"{expr}: {body}"
    result: list[dict[str, Any]] = body["data"]["result"]
    return result


def _panel_queries() -> dict[str, list[str]]:
    dashboard = json.loads(DASHBOARD.read_text())
    queries: dict[str, list[str]] = {}
    for panel in dashboard["panels"]:
        for target in panel.get("targets", []):
            expr = target["expr"]
            for variable, value in GRAFANA_VARIABLES.items():
                expr = expr.replace(variable, value)
            queries.setdefault(panel["title"], []).append(expr)
    return queries


def _alert_queries(prometheus: str) -> dict[str, str]:
    groups = httpx.get(f"{prometheus}/api/v1/rules", timeout=10).json()["data"]["groups"]
    return {rule["name"]: rule["query"] for group in groups for rule in group["rules"]}


def test_every_panel_runs_and_the_golden_signals_show_data(scraped: Scraped) -> None:
    queries = _panel_queries()
    assert set(GOLDEN_PANELS) <= set(queries)
    for title, exprs in queries.items():
        results = [_query(scraped.prometheus, expr) for expr in exprs]
        if title in GOLDEN_PANELS:
            values = [float(s["value"][1]) for result in results for s in result]
            assert any(v > 0 for v in values), f"{title}: no data above 0 ({exprs} -> {results})"


def test_prometheus_loads_every_alert_and_each_expression_runs(scraped: Scraped) -> None:
    alerts = _alert_queries(scraped.prometheus)
    in_file = re.findall(r"^\s*- alert: (\S+)", ALERTS.read_text(), re.MULTILINE)
    assert sorted(alerts) == sorted(in_file)
    for expr in alerts.values():
        _query(scraped.prometheus, expr)
    # A stack that just finished its tasks fires none of them.
    firing = _query(scraped.prometheus, 'ALERTS{alertstate="firing"}')
    assert firing == []


def test_the_new_gauges_are_scraped(scraped: Scraped) -> None:
    """What the alerts rely on: each worker's NATS connection and its consumers' backlog."""
    connected = _query(scraped.prometheus, "deckhands_nats_connected")
    assert {s["metric"]["job"] for s in connected} == {
        f"deckhands-{name}" for name in ("gateway", *scraped.stack.config.metrics_ports)
    }
    assert all(s["value"][1] == "1" for s in connected)
    consumers = _query(scraped.prometheus, "max by (consumer) (deckhands_consumer_pending)")
    # The gateway's webhook consumer is a plain JetStream pull consumer: it reports its own.
    assert {"controller", "reasoner", "runtime", "security", "webhooks"} <= {
        s["metric"]["consumer"] for s in consumers
    }
    # How long messages waited for each worker's consumer (the stack ran tasks).
    waited = _query(
        scraped.prometheus, "sum by (consumer) (deckhands_consumer_wait_seconds_count) > 0"
    )
    assert {"controller", "reasoner", "runtime", "security"} <= {
        s["metric"]["consumer"] for s in waited
    }


def _unbounded_label_values(prometheus: str, selector: str) -> dict[str, list[str]]:
    """Label values of the series `selector` matches that look like ids, by label name."""
    match = {"match[]": selector}
    names = httpx.get(f"{prometheus}/api/v1/labels", params=match, timeout=10).json()["data"]
    found: dict[str, list[str]] = {}
    for name in set(names) - TARGET_LABELS:
        values = httpx.get(
            f"{prometheus}/api/v1/label/{name}/values", params=match, timeout=10
        ).json()["data"]
        ids = [v for v in values if AN_ID.search(v)]
        if ids:
            found[name] = ids[:3]
    return found


def test_no_deckhands_label_carries_a_task_id(scraped: Scraped) -> None:
    selector = '{__name__=~".+", __name__!~"faststream_.*"}'
    assert _unbounded_label_values(scraped.prometheus, selector) == {}


def test_no_faststream_label_carries_a_task_id(scraped: Scraped) -> None:
    assert _unbounded_label_values(scraped.prometheus, '{__name__=~"faststream_.*"}') == {}
