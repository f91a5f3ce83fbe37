"""Issue 24, findings 2, 3 and the reserved secret names of 6, attacked from outside on the real
stack: a tenant's secret never reaches the LLM provider, the events, the trajectory, the live
stream or a service's log, in any form a program prints it in, whatever the agent (or a
malicious repository steering it) makes its commands do; and a secret cannot set a variable
that changes how the sandbox's shell, Python, git or ssh run.

What the provider saw is what the scripted LLM server received (its GET /prompts)."""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import httpx
import pytest
from conftest import Tenant

from shared.events import new_id
from shared.secret_redaction import secret_forms
from tools.stack import Stack

pytestmark = [pytest.mark.docker, pytest.mark.timeout(300)]


def _put_secret(tenant: Tenant, name: str, value: str) -> None:
    answer = tenant.http.put(f"/v1/secrets/{name}", json={"value": value})
    assert answer.status_code in (200, 201), answer.text


def _prompts(stack: Stack, marker: str) -> list[list[dict[str, Any]]]:
    """The message lists the model was sent for the task whose text holds `marker`."""
    answer = httpx.get(
        f"http://127.0.0.1:{stack.config.llm_port}/prompts", params={"task": marker}, timeout=10
    )
    assert answer.status_code == 200, answer.text
    found = answer.json()["prompts"]
    assert len(found) == 1, found
    return [request["messages"] for request in found[0]["requests"]]


def _strings(value: Any) -> Iterator[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, list):
        for v in value:
            yield from _strings(v)
    elif isinstance(value, dict):
        for k, v in value.items():
            yield k
            yield from _strings(v)


def _sse_data(text: str) -> list[Any]:
    return [json.loads(line[5:]) for line in text.splitlines() if line.startswith("data:")]


def _assert_nowhere(value: str, where: Iterable[tuple[str, str]]) -> None:
    """No form of `value` in any (what, text): the raw value, every quoted, escaped and encoded
    form the Redactor knows, and those forms JSON-escaped once more (a text of JSON)."""
    inner, whole = secret_forms(value)
    forms = {*inner, *whole}
    forms |= {json.dumps(form)[1:-1] for form in forms}
    for what, text in where:
        for form in forms:
            assert form not in text, f"the secret is in the {what}, as {form!r}"


def _service_logs(stack: Stack) -> list[tuple[str, str]]:
    return [(f.name, f.read_text(errors="replace")) for f in sorted(stack.logs.glob("*.log"))]


def test_a_secret_a_command_writes_into_agents_md_never_reaches_the_prompt(
    stack: Stack, new_tenant: Callable[..., Tenant]
) -> None:
    """Finding 2: the repository instructions join the system prompt; a command (as a
    malicious repository may ask the agent) writes the secret into AGENTS.md, the next upload
    reads the file again, the next message sends the prompt. The runtime redacts the
    instructions before it keeps them."""
    tenant = new_tenant()
    unique = uuid.uuid4().hex
    value = f"leak-{unique}-it's"
    _put_secret(tenant, "LEAK_TOKEN", value)
    marker = new_id()
    task_id = tenant.create(task=f"secret-into-agents-md: {marker}", secrets=["LEAK_TOKEN"])
    tenant.wait(task_id, "AWAITING_USER_INPUT", timeout_s=120)
    workspace = f"/v1/tasks/{task_id}/workspace"
    written = tenant.http.get(workspace, params={"path": "AGENTS.md"})
    assert written.status_code == 200 and unique in written.text  # the attack's first half

    up = tenant.http.put(workspace, params={"path": "upload.txt"}, content=b"an upload\n")
    assert up.status_code == 200, up.text
    sent = tenant.http.post(f"/v1/tasks/{task_id}/messages", json={"content": "go on"})
    assert sent.status_code == 202, sent.text
    tenant.wait(task_id, "FINISHED", timeout_s=120)

    prompts = _prompts(stack, marker)
    system = prompts[-1][0]["content"]
    assert "# Repository instructions (AGENTS.md)" in system, system
    assert "Use the token <secret:LEAK_TOKEN> when asked." in system, system
    events = tenant.http.get(f"/v1/tasks/{task_id}/events", params={"after": 0}).json()["events"]
    used = [e["instructions"] for e in events if e.get("instructions")]
    assert used and used[-1]["path"] == "AGENTS.md", events
    texts = [(f"prompt {i}", s) for i, p in enumerate(prompts) for s in _strings(p)]
    texts += [("events", s) for s in _strings(events)]
    texts += _service_logs(stack)
    _assert_nowhere(value, texts)
    for what, text in texts:
        assert unique not in text, f"the secret is in the {what}"


def test_a_quoted_secret_under_set_x_is_in_no_output_event_stream_or_prompt(
    stack: Stack, new_tenant: Callable[..., Tenant]
) -> None:
    """Finding 3: a value holding quotes, `$`, a tab, printed by `set -x`, `printf %q`,
    `declare -p`, `export -p`, and by Python as JSON, repr, shlex and URL-encoded; then more
    commands in the traced (and verbose) shell, each of which gets the secret exported, and a
    Python cell. No form of it anywhere: events, trajectory, the live stream, the task's view,
    every prompt, every service's log."""
    tenant = new_tenant()
    unique = uuid.uuid4().hex
    value = f'it\'s "q" $HOME\t{unique}'
    _put_secret(tenant, "QUOTED_TOKEN", value)
    marker = new_id()
    task_id = tenant.create(task=f"secret-quoted-under-xtrace: {marker}", secrets=["QUOTED_TOKEN"])
    with tenant.http.stream(
        "GET",
        f"/v1/tasks/{task_id}/events/stream",
        params={"close_on_terminal": "true"},
        timeout=httpx.Timeout(30, read=120),
    ) as stream:
        assert stream.status_code == 200
        sse = "".join(stream.iter_text())
    view = tenant.wait(task_id, "FINISHED", timeout_s=60)

    events = tenant.http.get(f"/v1/tasks/{task_id}/events", params={"after": 0}).json()["events"]
    outputs = [e for e in events if e["kind"] in ("run_output", "python_output")]
    assert len(outputs) == 4, events
    printed = outputs[0]["content"]
    # Each way of printing it was redacted, not skipped: the value was there to print.
    assert printed.count("<secret:QUOTED_TOKEN>") >= 8, printed
    assert "+ echo <secret:QUOTED_TOKEN>" in printed, printed
    assert "still traced" in outputs[1]["content"] and "verbose too" in outputs[1]["content"]
    # The traced shell printed nothing of the secret's export in front of the next commands
    # (not even redacted): the value never was on a line it read.
    assert "QUOTED_TOKEN" not in outputs[1]["content"], outputs[1]
    assert "QUOTED_TOKEN=<secret:QUOTED_TOKEN>" in outputs[2]["content"], outputs[2]
    assert outputs[3]["content"].strip() == "'<secret:QUOTED_TOKEN>'", outputs[3]  # its repr
    assert "<secret:QUOTED_TOKEN>" in view["result"]["final_message"]

    trajectory = tenant.http.get(f"/v1/tasks/{task_id}/trajectory")
    assert trajectory.status_code == 200
    prompts = _prompts(stack, marker)
    texts = [("events", s) for s in _strings(events)]
    texts += [("trajectory", s) for s in _strings(trajectory.json())]
    texts += [("event stream", s) for s in _strings(_sse_data(sse))]
    texts += [("task view", s) for s in _strings(view)]
    texts += [(f"prompt {i}", s) for i, p in enumerate(prompts) for s in _strings(p)]
    texts += [("raw event stream", sse), ("raw trajectory", trajectory.text)]
    texts += _service_logs(stack)
    _assert_nowhere(value, texts)
    for what, text in texts:
        assert unique not in text, f"the secret is in the {what}"


def test_a_secret_typed_into_the_task_text_is_in_no_view_trajectory_or_prompt(
    stack: Stack, new_tenant: Callable[..., Tenant]
) -> None:
    """The task text is a user's message too: kept in the State, shown in the task's view
    and its trajectory export, and the first message of the prompt."""
    tenant = new_tenant()
    unique = uuid.uuid4().hex
    value = f"typed-{unique}"
    _put_secret(tenant, "TYPED_TOKEN", value)
    marker = new_id()
    task_id = tenant.create(task=f"finish {marker} using {value}", secrets=["TYPED_TOKEN"])
    view = tenant.wait(task_id, "FINISHED", timeout_s=60)
    assert view["task"] == f"finish {marker} using <secret:TYPED_TOKEN>", view
    trajectory = tenant.http.get(f"/v1/tasks/{task_id}/trajectory")
    assert trajectory.status_code == 200
    prompts = _prompts(stack, marker)
    assert prompts[0][1] == {"role": "user", "content": view["task"]}, prompts[0]
    listed = tenant.http.get("/v1/tasks").text
    for what, text in (
        ("task view", json.dumps(view)),
        ("trajectory", trajectory.text),
        ("prompt", json.dumps(prompts)),
        ("task list", listed),
    ):
        assert unique not in text, f"the secret is in the {what}"


@pytest.mark.parametrize(
    "name",
    ["PYTHONSTARTUP", "GIT_SSH_COMMAND", "SHELLOPTS", "BASH_ENV", "pythonpath", "Ld_Preload"],
)
def test_names_that_change_how_the_sandbox_runs_are_refused(alpha: Tenant, name: str) -> None:
    """Finding 6 (part): such a secret would run code, or change how every command of its
    tasks is parsed or traced."""
    answer = alpha.http.put(f"/v1/secrets/{name}", json={"value": "/tmp/evil.py"})
    assert answer.status_code == 422, answer.text
    detail = str(answer.json()["detail"])
    assert f"secret name {name!r} is reserved" in detail and "choose another name" in detail
    listed = alpha.http.get("/v1/secrets")
    assert listed.status_code == 200
    assert name not in [s["name"] for s in listed.json()["secrets"]]


def test_a_task_naming_a_reserved_secret_is_refused(alpha: Tenant) -> None:
    """A secret stored before its name became reserved is never given to a command: a task
    that names it is refused with the reason, rather than run without it."""
    answer = alpha.http.post("/v1/tasks", json={"task": "x", "secrets": ["GIT_SSH_COMMAND"]})
    assert answer.status_code == 422, answer.text
    detail = str(answer.json()["detail"])
    assert "cannot be given" in detail and "'GIT_SSH_COMMAND' is reserved" in detail, detail
