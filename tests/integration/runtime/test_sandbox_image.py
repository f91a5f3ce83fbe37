"""The sandbox image has what agents reach for (issue 16, part 2), and each tool runs in it the
way a sandbox runs it: uid 1000, read-only root filesystem, no network, /workspace writable.

Each check is one command in a container of the image; a missing tool or one that cannot run as
the sandbox user fails its own case, naming what it printed.
"""

from __future__ import annotations

import uuid

import docker
import pytest

pytestmark = pytest.mark.timeout(300)

# (what, the command, a text its output must hold)
CHECKS = [
    ("python", "python --version", "Python 3"),
    ("python3", "python3 -c 'print(6*7)'", "42"),
    ("pip", "pip --version", "pip "),
    ("pytest", "pytest --version 2>&1", "pytest"),
    ("git", "git --version", "git version"),
    ("patch", "patch --version", "GNU patch"),
    ("diff", "diff --version", "diff (GNU diffutils)"),
    ("make", "make --version", "GNU Make"),
    ("jq", "echo '{\"a\": [1, 2]}' | jq -c '.a'", "[1,2]"),
    ("node", "node -e 'console.log(6*7)'", "42"),
    ("npm", "npm --version", "."),
    (
        # A Node project's tests, the way `npm test` runs them, with no network.
        "npm test runs a script",
        "mkdir -p n && cd n && echo 'process.exit(1 + 1 === 2 ? 0 : 1)' > t.js && "
        'printf \'{"name": "n", "scripts": {"test": "node t.js"}}\' > package.json && '
        "npm test --silent; echo rc=$?",
        "rc=0",
    ),
    ("tar gzip", "tar --version && gzip --version", "GNU tar"),
    ("zip unzip", "zip -v | head -2 && unzip -v | head -1", "UnZip"),
    ("grep sed awk", "echo abc | grep b | sed s/b/x/ | awk '{print toupper($0)}'", "AXC"),
    ("find xargs", "mkdir -p d && touch d/f && find d -type f | xargs ls", "d/f"),
    ("less file tree", "command -v less && file --version && tree --version", "tree v"),
    ("ps", "ps -o user= -p $$", "sandbox"),
    (
        "git commit and diff",
        "git init -q r && cd r && echo a > f && git add f && "
        "git -c user.email=a@b -c user.name=a commit -qm one && echo b > f && git diff",
        "+b",
    ),
    (
        # A commit needs no identity set first: the image has a default author.
        "git commit with the default author",
        "git init -q c && cd c && echo a > f && git add f && git commit -qm one && "
        "git log -1 --format='%an <%ae>'",
        "deckhands agent <agent@deckhands.invalid>",
    ),
    (
        "pytest runs a failing test",
        "printf 'def test_x():\\n    assert 1 == 2\\n' > test_x.py; "
        "pytest -q test_x.py; echo rc=$?",
        "rc=1",
    ),
    (
        "patch applies a diff",
        "printf 'a\\n' > p.txt && printf -- '--- p.txt\\n+++ p.txt\\n@@ -1 +1 @@\\n-a\\n+b\\n' "
        "| patch -p0 && cat p.txt",
        "b",
    ),
    (
        "make runs a target",
        "printf 'hi:\\n\\t@echo made\\n' > Makefile && make hi",
        "made",
    ),
    (
        # No root, no network: a local package installs into the user site (~/.local).
        "pip install without root",
        "mkdir -p pkg/demo_pkg && touch pkg/demo_pkg/__init__.py && "
        'printf \'from setuptools import setup\\nsetup(name="demo-pkg", version="1", '
        'packages=["demo_pkg"])\\n\' > pkg/setup.py && '
        "pip install -q --no-index --no-build-isolation ./pkg 2>&1 | tail -1; "
        "cd / && python -c 'import demo_pkg, site; print(\"imported\", site.USER_SITE)'",
        "imported /tmp/home/.local",
    ),
    (
        "python -m venv in the workspace",
        "python -m venv --without-pip venv && venv/bin/python -c 'import sys; print(sys.prefix)'",
        "/workspace/venv",
    ),
]


@pytest.mark.parametrize(("what", "command", "expected"), CHECKS, ids=[c[0] for c in CHECKS])
def test_tool_runs_as_the_sandbox_user(
    docker_client: docker.DockerClient,
    sandbox_image: str,
    pool_name: str,
    what: str,
    command: str,
    expected: str,
) -> None:
    name = f"deckhands-imagetest-{uuid.uuid4().hex[:8]}"
    container = docker_client.containers.run(
        sandbox_image,
        ["bash", "-c", f"mkdir -p $HOME && cd /workspace && {command}"],
        entrypoint=[],
        name=name,
        user="1000:1000",
        network_mode="none",
        read_only=True,
        tmpfs={"/tmp": "rw,exec,size=256m,mode=1777", "/workspace": "rw,exec,uid=1000,gid=1000"},
        labels={"deckhands.pool": pool_name, "deckhands.role": "sandbox"},
        detach=True,
    )
    try:
        result = container.wait(timeout=120)
        output = container.logs(stdout=True, stderr=True).decode("utf-8", "replace")
    finally:
        container.remove(force=True)
    assert expected in output, f"{what}: exit {result.get('StatusCode')}, printed:\n{output}"


def test_image_stays_small(docker_client: docker.DockerClient, sandbox_image: str) -> None:
    size = docker_client.images.get(sandbox_image).attrs["Size"]
    # 402 MiB with Node.js and npm (Debian's npm brings about 170 MB of its own modules).
    assert size < 450 * 1024 * 1024, f"the sandbox image grew to {size / 2**20:.0f} MiB"
