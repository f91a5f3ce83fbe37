"""Post a task to the gateway, print each event as it arrives, end with the result.

python -m tools.run_task "Write a Python script ..." [--gateway URL] [--timeout S] [--api-key K]

The API key is --api-key, else DECKHANDS_API_KEY, else the one `make up` wrote to .run/api_key.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

from .api_access import auth_headers, read_secret

__all__ = ["SEED_TASK", "default_api_key", "main", "run_task"]

LOCAL_API_KEY_FILE = Path(__file__).resolve().parent.parent / ".run" / "api_key"

SEED_TASK = "Write a Python script that prints the squares of 1 to 10 and run it"
_ENDED = {"FINISHED", "ERROR", "STOPPED", "REJECTED", "AWAITING_USER_INPUT"}


def _as_json(event: dict[str, Any]) -> str:
    return json.dumps(event)[:300]


def _describe(event: dict[str, Any]) -> str:
    kind = event["kind"]
    describers: dict[str, Callable[[dict[str, Any]], str]] = {
        "message": lambda e: e["content"],
        "run": lambda e: f"$ {e['command']}",
        "run_python": lambda e: e["code"],
        "write": lambda e: f"{e['path']} ({len(e['content'])} chars)\n{e['content'].rstrip()}",
        "read": lambda e: e["path"],
        "finish": lambda e: e["final_message"],
        "run_output": lambda e: f"[exit {e['exit_code']}, cwd {e['cwd']}]\n{e['content'].rstrip()}",
        "python_output": lambda e: e["content"].rstrip(),
        "write_output": lambda e: e["path"],
        "read_output": lambda e: e["content"].rstrip(),
        "error": lambda e: f"{e['error_code']}: {e['content']}",
        "agent_state_changed": lambda e: (
            f"{e['previous_state']} -> {e['agent_state']} {e['reason']}"
        ),
        "security_verdict": lambda e: f"{e['verdict']} risk={e['risk']} {e['reason']}".rstrip(),
    }
    detail = describers.get(kind, _as_json)(event)
    body = str(detail).replace("\n", "\n        ")
    return f"#{event['seq']:<3} {event['source']:<11} {kind:<20} {body}"


def default_api_key() -> str | None:
    return os.environ.get("DECKHANDS_API_KEY") or read_secret(LOCAL_API_KEY_FILE)


def run_task(
    gateway: str, task: str, timeout_s: float, out: Any = sys.stdout, *, api_key: str
) -> dict[str, Any]:
    with httpx.Client(base_url=gateway, timeout=30, headers=auth_headers(api_key)) as http:
        created = http.post("/v1/tasks", json={"task": task})
        created.raise_for_status()
        task_id = created.json()["id"]
        print(f"task {task_id} accepted: {task}", file=out)
        deadline = time.monotonic() + timeout_s
        with http.stream(
            "GET", f"/v1/tasks/{task_id}/events/stream", timeout=httpx.Timeout(30, read=20)
        ) as stream:
            for line in stream.iter_lines():
                if line.startswith("data:"):
                    event = json.loads(line[5:])
                    print(_describe(event), file=out, flush=True)
                    if event["kind"] == "agent_state_changed" and event["agent_state"] in _ENDED:
                        break
                if time.monotonic() > deadline:
                    raise TimeoutError(f"task {task_id} did not end within {timeout_s}s")
        result = http.get(f"/v1/tasks/{task_id}").json()
    print("\nresult:", json.dumps(result, indent=2, default=str), file=out)
    return dict(result)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("task", nargs="?", default=SEED_TASK)
    parser.add_argument("--gateway", default="http://127.0.0.1:8000")
    parser.add_argument("--timeout", type=float, default=300.0)
    parser.add_argument("--api-key", default=None, help="default: DECKHANDS_API_KEY, .run/api_key")
    args = parser.parse_args()
    api_key = args.api_key or default_api_key()
    if not api_key:
        parser.error("no API key: pass --api-key, set DECKHANDS_API_KEY, or `make up` first")
    result = run_task(args.gateway, args.task, args.timeout, api_key=api_key)
    sys.exit(0 if result.get("state") == "FINISHED" else 1)


if __name__ == "__main__":
    main()
