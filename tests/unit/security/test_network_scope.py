"""The network scope the security monitor gives a command (issue 27, item 6): the hosts of
the index `pip install` uses, the registry of `npm install`, the URL `git clone` or `curl`
fetches; nothing for a command that never connects; no scope (the task's whole policy) for a
command it cannot place."""

from __future__ import annotations

import pytest

from services.security.network_scope import NPM, PYPI, network_scope
from shared.events import CmdRunAction, EventSource, FileReadAction, RunPythonAction


def _scope(command: str) -> tuple[str, ...] | None:
    return network_scope(CmdRunAction(task_id="t", source=EventSource.AGENT, command=command))


@pytest.mark.parametrize(
    ("command", "scope"),
    [
        ("pip install requests", PYPI),
        ("python3 -m pip install -q 'requests>=2'", PYPI),
        ("pip install -r requirements.txt 2>&1 | tail -3", PYPI),
        (
            "cd /workspace && pip install --index-url http://127.0.0.2:8080/simple/ tinypkg",
            ("127.0.0.2:8080",),
        ),
        ("pip install -i https://pypi.corp.example/simple x", ("pypi.corp.example:443",)),
        ("pip install x --extra-index-url https://extra.example/s", (*PYPI, "extra.example:443")),
        ("pip install git+https://github.com/a/b.git", (*PYPI, "github.com:443")),
        ("npm install", NPM),
        ("FOO=1 npm ci", NPM),
        ("npm install --registry=http://127.0.0.2:9000/ tinynpm", ("127.0.0.2:9000",)),
        ("git clone https://github.com/a/b.git && cd b && ls", ("github.com:443",)),
        ("git -C repo pull https://gitlab.example:8443/x.git main", ("gitlab.example:8443",)),
        ("curl -sL https://example.com/x.tgz | tar xz", ("example.com:443",)),
        ("wget http://[2001:db8::1]:8080/f", ("[2001:db8::1]:8080",)),
        # Commands that never connect: nowhere.
        ("ls -la; echo hi > out.txt", ()),
        ("git status && git diff", ()),
        ("mkdir -p a/b &> /dev/null", ()),
        ("ls\npip install x", PYPI),  # a line break separates commands
        ('echo "a\nb" > f', ()),  # not inside quotes
        ("ls # and a comment: curl https://x.example", ()),
        ("u=${t#prefix}; pip install x", PYPI),  # a `#` inside a word is no comment
    ],
)
def test_a_command_it_can_place_gets_the_hosts_it_needs(
    command: str, scope: tuple[str, ...]
) -> None:
    assert _scope(command) == scope


@pytest.mark.parametrize(
    "command",
    [
        "python3 script.py",  # may connect anywhere
        "pip install x && python3 -c 'import urllib.request'",
        "git fetch",  # a remote by name: where it points is not in the command
        "git -C repo fetch origin",
        "curl -s $URL",  # not a URL in the text
        "bash -c 'pip install x'",
        "echo 'unclosed",
        "cd a\npython3 x.py",
        "u=${t#x}; nohup python3 bg.py &",
    ],
)
def test_a_command_it_cannot_place_gets_no_scope(command: str) -> None:
    assert _scope(command) is None


def test_only_commands_get_a_scope() -> None:
    assert network_scope(RunPythonAction(task_id="t", source=EventSource.AGENT, code="1")) is None
    read = FileReadAction(task_id="t", source=EventSource.AGENT, path="/workspace/x")
    assert network_scope(read) is None
