"""The gateway's HTTP API as the `deckhands` command uses it (httpx, synchronous).

`follow()` reads a task's Server-Sent Events and survives a network loss or a gateway restart:
it reconnects with `Last-Event-ID` (the last seq it handed out) and drops anything at or below
that seq, so each event is yielded once, in order.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx

__all__ = ["ENDED_STATES", "ApiError", "Client", "is_terminal"]

ENDED_STATES = frozenset({"FINISHED", "ERROR", "STOPPED", "REJECTED"})

_MAX_BACKOFF_S = 15.0


class ApiError(Exception):
    """The gateway refused a request (status >= 400) or could not be reached (status 0)."""

    def __init__(self, status: int, detail: str) -> None:
        super().__init__(detail)
        self.status = status
        self.detail = detail

    def __str__(self) -> str:
        return f"{self.status} {self.detail}" if self.status else self.detail


def _detail(response: httpx.Response) -> str:
    try:
        body = response.json()
    except ValueError:
        return response.text[:500] or response.reason_phrase
    detail = body.get("detail") if isinstance(body, dict) else None
    if isinstance(detail, list):
        parts = []
        for error in detail:
            where = ".".join(str(p) for p in error.get("loc", []) if p != "body")
            parts.append(f"{where}: {error.get('msg')}" if where else str(error.get("msg")))
        return "; ".join(parts)
    if isinstance(detail, str):
        return detail
    return response.text[:500]


def is_terminal(event: dict[str, Any]) -> bool:
    return event.get("kind") == "agent_state_changed" and event.get("agent_state") in ENDED_STATES


class Client:
    def __init__(self, url: str, api_key: str, *, timeout_s: float = 30.0) -> None:
        self.url = url
        self._http = httpx.Client(
            base_url=url,
            headers={"Authorization": f"Bearer {api_key}", "User-Agent": "deckhands-cli"},
            timeout=timeout_s,
        )

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- plain requests --------------------------------------------------------------------

    def request(
        self,
        method: str,
        path: str,
        *,
        json_body: Any = None,
        params: Any = None,
        idempotent: bool = False,
    ) -> Any:
        headers = {"Idempotency-Key": f"cli-{uuid.uuid4()}"} if idempotent else None
        try:
            response = self._http.request(
                method, path, json=json_body, params=params, headers=headers
            )
        except httpx.TransportError as exc:
            raise ApiError(0, f"cannot reach the gateway at {self.url}: {exc}") from exc
        if response.status_code == 401:
            raise ApiError(401, "the gateway refused the API key (missing, unknown or revoked)")
        if response.status_code >= 400:
            raise ApiError(response.status_code, _detail(response))
        if response.status_code == 204 or not response.content:
            return None
        if "json" not in response.headers.get("content-type", ""):
            return response.text
        return response.json()

    def create_task(self, body: dict[str, Any]) -> dict[str, Any]:
        # One Idempotency-Key per invocation: a retried POST does not start a second task.
        result: dict[str, Any] = self.request("POST", "/v1/tasks", json_body=body, idempotent=True)
        return result

    def fork(self, task_id: str, body: dict[str, Any]) -> dict[str, Any]:
        # One Idempotency-Key per invocation: a retried POST makes the same forks.
        result: dict[str, Any] = self.request(
            "POST", f"/v1/tasks/{task_id}/fork", json_body=body, idempotent=True
        )
        return result

    def rewind(self, task_id: str, to: int) -> dict[str, Any]:
        result: dict[str, Any] = self.request(
            "POST", f"/v1/tasks/{task_id}/rewind", json_body={"to": to}, idempotent=True
        )
        return result

    def task(self, task_id: str) -> dict[str, Any]:
        result: dict[str, Any] = self.request("GET", f"/v1/tasks/{task_id}")
        return result

    def tasks(
        self,
        *,
        states: list[str],
        labels: list[str],
        limit: int,
        cursor: str | None = None,
        forked_from: str | None = None,
    ) -> dict[str, Any]:
        params: list[tuple[str, str | int]] = [("limit", limit)]
        params += [("state", s) for s in states]
        params += [("label", label) for label in labels]
        if forked_from:
            params.append(("forked_from", forked_from))
        if cursor:
            params.append(("cursor", cursor))
        result: dict[str, Any] = self.request("GET", "/v1/tasks", params=params)
        return result

    def events_page(self, task_id: str, after: int, limit: int = 1000) -> dict[str, Any]:
        result: dict[str, Any] = self.request(
            "GET", f"/v1/tasks/{task_id}/events", params={"after": after, "limit": limit}
        )
        return result

    def history(self, task_id: str, after: int = 0) -> Iterator[dict[str, Any]]:
        """Every logged event after `after`, page by page."""
        while True:
            page = self.events_page(task_id, after)
            yield from page["events"]
            if not page["has_more"] or page["next_after"] <= after:
                return
            after = page["next_after"]

    def control(self, task_id: str, what: str) -> dict[str, Any]:
        result: dict[str, Any] = self.request(
            "POST", f"/v1/tasks/{task_id}/{what}", idempotent=True
        )
        return result

    def confirm(self, task_id: str, action_id: str, approve: bool) -> dict[str, Any]:
        result: dict[str, Any] = self.request(
            "POST",
            f"/v1/tasks/{task_id}/confirmation",
            json_body={"action_id": action_id, "approve": approve},
            idempotent=True,
        )
        return result

    def say(self, task_id: str, content: str) -> dict[str, Any]:
        result: dict[str, Any] = self.request(
            "POST", f"/v1/tasks/{task_id}/messages", json_body={"content": content}, idempotent=True
        )
        return result

    def trajectory(self, task_id: str) -> dict[str, Any]:
        result: dict[str, Any] = self.request("GET", f"/v1/tasks/{task_id}/trajectory")
        return result

    def workspace_diff(self, task_id: str) -> str:
        result: str | None = self.request("GET", f"/v1/tasks/{task_id}/workspace/diff")
        return result or ""  # no change: an empty answer

    def download_workspace(self, task_id: str, target: Path, path: str | None = None) -> int:
        """The workspace as a tar.gz (or, with `path`, one file of it) written to `target`;
        the bytes written. Streamed: a large workspace is never held in memory."""
        params = {"path": path} if path else None
        try:
            with self._http.stream(
                "GET", f"/v1/tasks/{task_id}/workspace", params=params, timeout=300
            ) as response:
                if response.status_code >= 400:
                    response.read()
                    raise ApiError(response.status_code, _detail(response))
                written = 0
                with target.open("wb") as out:
                    for chunk in response.iter_bytes():
                        out.write(chunk)
                        written += len(chunk)
                return written
        except httpx.TransportError as exc:
            raise ApiError(0, f"cannot reach the gateway at {self.url}: {exc}") from exc

    def upload_workspace(self, task_id: str, source: Path, path: str | None = None) -> Any:
        """A tar (plain or compressed) or zip archive extracted into the workspace (under
        `path`), or any other file written at `path`."""
        name = source.name.lower()
        if name.endswith(".zip"):
            content_type, kind = "application/zip", "zip"
        elif name.endswith((".tar", ".tar.gz", ".tgz", ".tar.bz2", ".tar.xz")):
            content_type, kind = "application/x-tar", "tar"
        else:
            content_type, kind = "application/octet-stream", "file"
            path = path or source.name
        params = {"format": kind} | ({"path": path} if path else {})
        try:
            with source.open("rb") as body:
                response = self._http.put(
                    f"/v1/tasks/{task_id}/workspace",
                    content=body,
                    params=params,
                    headers={"Content-Type": content_type},
                    timeout=300,
                )
        except httpx.TransportError as exc:
            raise ApiError(0, f"cannot reach the gateway at {self.url}: {exc}") from exc
        if response.status_code >= 400:
            raise ApiError(response.status_code, _detail(response))
        return response.json()

    def delete(self, task_id: str) -> None:
        self.request("DELETE", f"/v1/tasks/{task_id}")

    # --- the live stream -------------------------------------------------------------------

    def follow(
        self,
        task_id: str,
        after: int = 0,
        *,
        idle_s: float = 40.0,
        on_reconnect: Callable[[str], None] = lambda _: None,
        stop_at_end: bool = True,
        deadline: float | None = None,
    ) -> Iterator[dict[str, Any]]:
        """The task's events after `after`, live. Ends after a terminal state change when
        `stop_at_end`; otherwise runs until the caller stops iterating. TimeoutError once
        `deadline` (time.monotonic()) passes: checked on each line the gateway writes (an idle
        stream gets a comment every 15 s) and before each reconnection."""

        def lines(response: httpx.Response) -> Iterator[str]:
            for line in response.iter_lines():
                if deadline is not None and time.monotonic() > deadline:
                    raise TimeoutError(f"task {task_id}: still following at the deadline")
                yield line

        last = after
        attempt = 0
        retry_s = 2.0
        while True:
            headers = {"Accept": "text/event-stream"}
            if last > 0:
                headers["Last-Event-ID"] = str(last)
            wait_s: float | None = None
            try:
                with self._http.stream(
                    "GET",
                    f"/v1/tasks/{task_id}/events/stream",
                    headers=headers,
                    # The gateway writes a comment every 15 s on an idle stream.
                    timeout=httpx.Timeout(30.0, read=idle_s),
                ) as response:
                    if response.status_code in (401, 404, 422):
                        response.read()
                        raise ApiError(response.status_code, _detail(response))
                    if response.status_code >= 400:
                        response.read()
                        retry_after = response.headers.get("retry-after", "")
                        wait_s = float(retry_after) if retry_after.isdigit() else None
                        raise httpx.HTTPStatusError(
                            f"{response.status_code} {_detail(response)}",
                            request=response.request,
                            response=response,
                        )
                    attempt = 0
                    for frame in _frames(lines(response)):
                        if "retry" in frame and frame["retry"].isdigit():
                            retry_s = int(frame["retry"]) / 1000
                        if "data" not in frame:
                            continue
                        event = json.loads(frame["data"])
                        seq = event.get("seq")
                        if not isinstance(seq, int):
                            seq = int(frame.get("id", "0") or 0)
                        if seq <= last:
                            continue  # seen before the reconnect
                        last = seq
                        yield event
                        if stop_at_end and is_terminal(event):
                            return
            except (httpx.TransportError, httpx.HTTPStatusError) as exc:
                reason = str(exc) or type(exc).__name__
            else:
                reason = "the gateway ended the stream"
            attempt += 1
            backoff = wait_s if wait_s is not None else retry_s * 2 ** min(attempt - 1, 3)
            backoff = min(backoff, _MAX_BACKOFF_S)
            if deadline is not None and time.monotonic() + backoff > deadline:
                raise TimeoutError(f"task {task_id}: {reason}, and the deadline is near")
            on_reconnect(f"{reason}; reconnecting after #{last} in {backoff:.0f} s")
            time.sleep(backoff)


def _frames(lines: Iterator[str]) -> Iterator[dict[str, str]]:
    """SSE frames as {field: value} (data lines joined), per the HTML spec's parsing rules."""
    frame: dict[str, str] = {}
    for line in lines:
        if line == "":
            if frame:
                yield frame
            frame = {}
            continue
        if line.startswith(":"):
            continue
        field, _, value = line.partition(":")
        if value.startswith(" "):
            value = value[1:]
        if field == "data" and "data" in frame:
            frame["data"] += "\n" + value
        else:
            frame[field] = value
    if frame:
        yield frame
