"""The network scope the security monitor gives a command (issue 27, item 6): the hosts of
the index `pip install` uses, the registry of `npm install`, the URL `git clone` or `curl`
fetches; nothing for a command that never connects; no scope (the task's whole policy) for a
command it cannot place. The same for a Python cell (cell_scope.py)."""

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


def _cell(code: str) -> tuple[str, ...] | None:
    return network_scope(RunPythonAction(task_id="t", source=EventSource.AGENT, code=code))


@pytest.mark.parametrize(
    ("code", "scope"),
    [
        ("print(sum(i * i for i in range(10)))", ()),
        ("import math, json\nx = math.sqrt(2)\nprint(json.dumps({'x': x}))", ()),
        ("def f(a):\n    return a + 1\n\nprint([f(n) for n in range(3)])", ()),
        ("with open('/workspace/a.txt') as f:\n    print(f.read())", ()),
        (
            "import urllib.request\nprint(urllib.request.urlopen('https://pypi.org/simple/').status)",
            ("pypi.org:443",),
        ),
        ("import requests\nr = requests.get('http://127.0.0.2:8080/x')", ("127.0.0.2:8080",)),
    ],
)
def test_a_cell_it_can_place_gets_the_hosts_it_needs(code: str, scope: tuple[str, ...]) -> None:
    assert _cell(code) == scope


@pytest.mark.parametrize(
    "code",
    [
        "s.send(b'x')",  # a socket an earlier cell made
        "print(df.head())",  # any name from an earlier cell
        "import os\nos.system('curl https://example.com')",
        "import subprocess\nsubprocess.run(['pip', 'install', 'x'])",
        "import socket",
        "import uuid\nuuid.os.system('x')",  # a module reached through another's attribute
        "import random\nrandom._os.system('x')",
        "import urllib.request\nurllib.request.socket.create_connection(('h', 1))",
        "().__class__.__base__.__subclasses__()",
        "exec('import socket')",
        "getattr(__builtins__, '__import__')('socket')",
        "import requests\nrequests.get(url)",  # a URL the cell does not write
        "from . import x",
        "!pip install x",  # not Python
    ],
)
def test_a_cell_it_cannot_place_gets_no_scope(code: str) -> None:
    assert _cell(code) is None


def test_only_commands_and_cells_get_a_scope() -> None:
    read = FileReadAction(task_id="t", source=EventSource.AGENT, path="/workspace/x")
    assert network_scope(read) is None
