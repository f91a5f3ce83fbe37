"""A scripted OpenAI-compatible chat server: litellm reaches it exactly as it reaches a provider.

    python -m tools.scripted_llm --script tools/scripted_llm/scripts/seed_squares.json --port 8765

then point deckhands at it with DECKHANDS_LLM_MODEL=openai/scripted,
DECKHANDS_LLM_API_BASE=http://127.0.0.1:8765/v1 and any DECKHANDS_LLM_API_KEY.

Endpoints: `POST /v1/chat/completions` (JSON, or Server-Sent Events when `stream` is true),
`GET /v1/models`, `GET /health`, and `GET /stats`: the chat requests received so far (failed
ones included, those refused by the limits not), in total and per task (the first user
message), and what the limits saw, e.g. {"requests": 3, "tasks": {"Write squares": 3},
"refused_429": 0, "max_concurrent_seen": 1, "max_requests_in_60s": 3, "max_tokens_in_60s": 950}.
Any model name and any API key are accepted.
`GET /prompts?task=TEXT`: what the model was sent, for tests that check a prompt (what a
provider would see): {"prompts": [{"task": ..., "requests": [{"messages": [...]}, ...]}]}, one
entry per task whose first user message contains TEXT (case-sensitive), with its last
PROMPTS_PER_TASK requests, oldest first; the last PROMPT_TASKS tasks are kept.

The script format is tools/scripted_llm/script.py; which turn answers a request,
tools/scripted_llm/responder.py; the limits, tools/scripted_llm/limits.py.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import sys
import threading
import time
from dataclasses import replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs

# The names of the script, the responder and the limits are imported from here too.
from .limits import LIMIT_WINDOW_S
from .replies import HttpError, Reply
from .responder import (
    CONDENSED_MARKER,
    INVALID_REPLY_MARKER,
    PROMPT_TASKS,
    PROMPTS_PER_TASK,
    Responder,
)
from .script import (
    LIMIT_COUNTS,
    Conversation,
    Limits,
    Script,
    ScriptError,
    Turn,
    load_script,
    parse_script,
)

__all__ = [
    "CONDENSED_MARKER",
    "INVALID_REPLY_MARKER",
    "LIMIT_WINDOW_S",
    "PROMPTS_PER_TASK",
    "PROMPT_TASKS",
    "Conversation",
    "Limits",
    "Script",
    "ScriptError",
    "ScriptedLLMServer",
    "Turn",
    "load_script",
    "main",
    "parse_script",
]

log = logging.getLogger("deckhands.scripted_llm")


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    # The headers and the body go out in two writes: with Nagle's algorithm the body waited
    # for the client's delayed ACK of the headers, 40 ms on every call of a kept-alive
    # connection after its first few (a 6 ms "instant" reply measured 45 ms).
    disable_nagle_algorithm = True
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("%s " + format, self.address_string(), *args)

    # --- routes ---

    def do_GET(self) -> None:
        path = self.path.split("?", 1)[0].rstrip("/")
        if path in ("/v1/models", "/models"):
            model = self.server.responder.script.model
            self._json(
                200,
                {
                    "object": "list",
                    "data": [
                        {"id": model, "object": "model", "created": 0, "owned_by": "deckhands"}
                    ],
                },
            )
        elif path in ("/health", "/healthz"):
            self._json(200, {"status": "ok"})
        elif path in ("/stats", "/v1/stats"):
            self._json(200, self.server.responder.stats())
        elif path in ("/prompts", "/v1/prompts"):
            query = parse_qs(self.path.partition("?")[2])
            self._json(200, self.server.responder.prompts(query.get("task", [""])[0]))
        else:
            self._error(HttpError(404, f"no route {self.path}", "not_found_error"))

    def do_POST(self) -> None:
        path = self.path.split("?", 1)[0].rstrip("/")
        if path not in ("/v1/chat/completions", "/chat/completions"):
            self._error(HttpError(404, f"no route {self.path}", "not_found_error"))
            return
        try:
            body = self._read_json()
            reply = self.server.responder.reply(body)
        except HttpError as exc:
            self._error(exc)
            return
        model = str(body.get("model") or self.server.responder.script.model)
        completion_id = f"chatcmpl-{hashlib.sha1(repr(reply).encode()).hexdigest()[:24]}"
        created = int(time.time())
        if body.get("stream"):
            options = body.get("stream_options") or {}
            self._stream(reply, model, completion_id, created, bool(options.get("include_usage")))
            return
        self._json(
            200,
            {
                "id": completion_id,
                "object": "chat.completion",
                "created": created,
                "model": model,
                "choices": [
                    {"index": 0, "message": reply.message(), "finish_reason": reply.finish_reason}
                ],
                "usage": reply.usage(),
            },
        )

    # --- helpers ---

    def _read_json(self) -> dict[str, Any]:
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        try:
            body = json.loads(raw or b"null")
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise HttpError(400, f"body is not JSON: {exc}") from exc
        if not isinstance(body, dict):
            raise HttpError(400, "body must be a JSON object")
        return body

    def _json(
        self, status: int, payload: dict[str, Any], headers: dict[str, str] | None = None
    ) -> None:
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(data)

    def _error(self, exc: HttpError) -> None:
        headers = {}
        if exc.retry_after_s is not None:
            headers["Retry-After"] = f"{exc.retry_after_s:g}"
        self._json(
            exc.status,
            {"error": {"message": exc.message, "type": exc.kind, "code": exc.code}},
            headers,
        )

    def _stream(
        self, reply: Reply, model: str, completion_id: str, created: int, include_usage: bool
    ) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Connection", "close")
        self.end_headers()
        self.close_connection = True
        base = {
            "id": completion_id,
            "object": "chat.completion.chunk",
            "created": created,
            "model": model,
        }

        def send(chunk: dict[str, Any]) -> None:
            self.wfile.write(f"data: {json.dumps({**base, **chunk})}\n\n".encode())

        for delta in reply.stream_deltas():
            send({"choices": [{"index": 0, "delta": delta, "finish_reason": None}]})
        send({"choices": [{"index": 0, "delta": {}, "finish_reason": reply.finish_reason}]})
        if include_usage:
            send({"choices": [], "usage": reply.usage()})
        self.wfile.write(b"data: [DONE]\n\n")
        self.wfile.flush()


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    # Hundreds of agents call at once in load tests: the default backlog of 5 drops them.
    request_queue_size = 1024

    def __init__(self, address: tuple[str, int], responder: Responder) -> None:
        super().__init__(address, _Handler)
        self.responder = responder


class ScriptedLLMServer:
    """The server in a background thread: `with ScriptedLLMServer(script) as srv: srv.base_url`."""

    def __init__(self, script: Script, host: str = "127.0.0.1", port: int = 0) -> None:
        self.host = host
        self._server = _Server((host, port), Responder(script))
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}/v1"

    def start(self) -> ScriptedLLMServer:
        # A short poll interval: stop() returns at once, which keeps test teardown quick.
        self._thread = threading.Thread(
            target=self._server.serve_forever,
            kwargs={"poll_interval": 0.05},
            name="scripted-llm",
            daemon=True,
        )
        self._thread.start()
        return self

    def serve_forever(self) -> None:
        self._server.serve_forever()

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        if self._thread is not None:
            self._thread.join(5)

    def __enter__(self) -> ScriptedLLMServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive int, got {text}")
    return value


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m tools.scripted_llm",
        description="A scripted OpenAI-compatible chat server (see the module docstring).",
    )
    parser.add_argument("--script", required=True, help="the script file (JSON)")
    parser.add_argument("--port", type=int, default=8765, help="port (0: any free port)")
    parser.add_argument("--host", default="127.0.0.1")
    for key in LIMIT_COUNTS:
        flag = "--" + key.replace("_", "-")
        parser.add_argument(
            flag, type=_positive_int, metavar="N", help=f"limits.{key} (wins over the script)"
        )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s scripted-llm %(message)s")
    try:
        script = load_script(args.script)
    except ScriptError as exc:
        sys.exit(f"scripted_llm: {exc}")
    given = {key: getattr(args, key) for key in LIMIT_COUNTS if getattr(args, key) is not None}
    if given:
        script = replace(script, limits=replace(script.limits, **given))
    try:
        server = ScriptedLLMServer(script, args.host, args.port)
    except OSError as exc:
        sys.exit(f"scripted_llm: cannot listen on {args.host}:{args.port}: {exc}")
    limits = ", ".join(
        f"{key} {getattr(script.limits, key)}"
        for key in LIMIT_COUNTS
        if getattr(script.limits, key) is not None
    )
    print(
        f"scripted LLM listening on {server.base_url} (model {script.model}"
        + (f"; limits: {limits}" if limits else "")
        + ")",
        flush=True,
    )
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server._server.server_close()


if __name__ == "__main__":
    main()
