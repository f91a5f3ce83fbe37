"""Helpers shared by the e2e tests: a GET that outlasts a killed part of the stack, a wait
for tasks to end while parts are killed, and a webhook receiver on loopback with the
signature check docs/tenants.md ("Webhooks") documents."""

from __future__ import annotations

import hashlib
import hmac
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx

__all__ = [
    "Receiver",
    "get_until_ok",
    "log_of",
    "verify_signature",
    "wait_for_state",
    "wait_until_ended",
]


def get_until_ok(client: httpx.Client, path: str) -> Any:
    """GET `path` until it answers 200 (the gateway, NATS or Redis may be the one killed just
    now), for about 30 s; the error names the last answer."""
    last = "no answer"
    for _ in range(150):
        try:
            response = client.get(path)
            if response.status_code == 200:
                return response.json()
            last = f"{response.status_code} {response.text[:300]}"
        except httpx.TransportError as exc:
            last = repr(exc)
        time.sleep(0.2)
    raise AssertionError(f"GET {path} kept failing; last: {last}")


def wait_until_ended(client: httpx.Client, task_ids: list[str], timeout_s: float) -> dict[str, Any]:
    """The view of each task that ended (FINISHED, ERROR or STOPPED) within `timeout_s`,
    polled once a second; a task missing from the result never ended."""
    views: dict[str, Any] = {}
    deadline = time.monotonic() + timeout_s
    while len(views) < len(task_ids) and time.monotonic() < deadline:
        for task_id in [t for t in task_ids if t not in views]:
            view = get_until_ok(client, f"/v1/tasks/{task_id}")
            if view["state"] in {"FINISHED", "ERROR", "STOPPED"}:
                views[task_id] = view
        time.sleep(1)
    return views


def create_task(http: httpx.Client, **body: Any) -> str:
    """POST /v1/tasks with `body`; the new task's id (the error names the answer)."""
    response = http.post("/v1/tasks", json=body)
    assert response.status_code == 202, response.text
    return str(response.json()["id"])


def wait_for_state(
    http: httpx.Client, task_id: str, *states: str, timeout_s: float = 120
) -> dict[str, Any]:
    """The task's view once it is in one of `states`; the error names the last view."""
    deadline = time.monotonic() + timeout_s
    while True:
        view = http.get(f"/v1/tasks/{task_id}").json()
        if view["state"] in states:
            return dict(view)
        assert time.monotonic() < deadline, f"task never reached {states}: {view}"
        time.sleep(0.3)


def log_of(http: httpx.Client, task_id: str) -> list[dict[str, Any]]:
    """The task's logged events, as storage has them now."""
    return list(http.get(f"/v1/tasks/{task_id}/events", params={"after": 0}).json()["events"])


class Receiver:
    """A webhook receiver on loopback: answers `failures` requests with 500, then 200."""

    def __init__(self, failures: int = 0) -> None:
        self.failures = failures
        self.requests: list[tuple[dict[str, str], bytes, int, float]] = []
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                status = 500 if len(receiver.requests) < receiver.failures else 200
                receiver.requests.append(
                    (dict(self.headers.items()), body, status, time.monotonic())
                )
                self.send_response(status)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *_: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/hook"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def wait_for(self, count: int, timeout_s: float = 60) -> None:
        deadline = time.monotonic() + timeout_s
        while len(self.requests) < count and time.monotonic() < deadline:
            time.sleep(0.1)
        assert len(self.requests) >= count, f"{len(self.requests)} of {count} requests came"


def verify_signature(secret: str, header: str, body: bytes, tolerance_s: int = 300) -> bool:
    """The receiver's check, as docs/tenants.md ("Webhooks") documents it."""
    fields = dict(part.split("=", 1) for part in header.split(","))
    timestamp = int(fields["t"])
    expected = hmac.new(
        secret.encode(), f"{timestamp}.".encode() + body, hashlib.sha256
    ).hexdigest()
    fresh = abs(time.time() - timestamp) <= tolerance_s
    return fresh and hmac.compare_digest(expected, fields["v1"])
