"""The git scripts of the workspace helpers (services/runtime/workspace_git.py), run in a
container of the sandbox image as a helper runs them, on the real Docker engine.

Their git works in a git directory of its own over the workspace's data; these pin down what
that must keep: an edit of the same size made in the checkout's own second still shows in the
diff (git's "racily clean" check needs the index's own time, which a plain copy loses: the
e2e repository test caught it), and a repository's settings run nothing.
"""

from __future__ import annotations

import docker
import pytest

from services.runtime.workspace_git import checkout_script, diff_script, upload_script

pytestmark = [pytest.mark.docker, pytest.mark.timeout(120)]

_REPO = (
    "mkdir -p /tmp/src && cd /tmp/src && git init -q -b main && printf 'a - b\\n' > calc.py "
    "&& git -c user.name=a -c user.email=a@a add -A "
    "&& git -c user.name=a -c user.email=a@a commit -qm x "
    "&& git clone -q --no-checkout /tmp/src /tmp/clone "
    "&& git -C /tmp/clone update-ref refs/deckhands/start HEAD "
    "&& cp -a /tmp/clone/.git /workspace/.git && cd /workspace\n"
)


def _run(client: docker.DockerClient, image: str, pool: str, script: str) -> str:
    out = client.containers.run(
        image,
        ["bash", "-c", script],
        entrypoint=[],
        user="1000:1000",
        environment={
            "HOME": "/tmp/home",
            "GIT_CONFIG_NOSYSTEM": "1",
            "GIT_CONFIG_GLOBAL": "/dev/null",
        },
        tmpfs={"/workspace": "uid=1000,gid=1000,exec", "/tmp": "exec,mode=1777"},
        network_mode="none",
        labels={"deckhands.pool": pool},
        remove=True,
        stdout=True,
        stderr=True,
    )
    return out.decode() if isinstance(out, bytes) else str(out)


def test_an_edit_of_the_same_size_in_the_checkouts_second_shows_in_the_diff(
    docker_client: docker.DockerClient, sandbox_image: str, pool_name: str
) -> None:
    script = (
        _REPO
        + f"( {checkout_script(1000)}\n) > /dev/null || echo CHECKOUT-FAILED\n"
        + "printf 'a + b\\n' > calc.py\n"  # the same size, within the same second
        + "sleep 1.1\n"
        + diff_script()
    )
    out = _run(docker_client, sandbox_image, pool_name, script)
    assert "CHECKOUT-FAILED" not in out, out
    assert "-a - b" in out and "+a + b" in out, out


def test_an_uploaded_trees_baseline_sees_an_edit_of_the_same_size(
    docker_client: docker.DockerClient, sandbox_image: str, pool_name: str
) -> None:
    script = (
        "cd /workspace && printf 'one\\n' > notes.txt\n"
        + f"( {upload_script(1000)}\n) > /dev/null || echo BASELINE-FAILED\n"
        + "printf 'two\\n' > notes.txt\nsleep 1.1\n"
        + diff_script()
    )
    out = _run(docker_client, sandbox_image, pool_name, script)
    assert "BASELINE-FAILED" not in out, out
    assert "-one" in out and "+two" in out and ".deckhands" not in out, out


def test_a_repositorys_settings_run_nothing(
    docker_client: docker.DockerClient, sandbox_image: str, pool_name: str
) -> None:
    evil = (
        "[filter \"evil\"]\n\tclean = sh -c 'echo FILTER-$((40+2))'\n"
        "[diff \"evil\"]\n\ttextconv = sh -c 'echo TEXTCONV-$((40+2))'\n"
        "\tcommand = sh -c 'echo DRIVER-$((40+2))'\n"
        "[diff]\n\texternal = sh -c 'echo EXTERNAL-$((40+2))'\n"
        "[core]\n\tfsmonitor = sh -c 'kill -9 $PPID'\n"
    )
    script = (
        _REPO
        + f"( {checkout_script(1000)}\n) > /dev/null || echo CHECKOUT-FAILED\n"
        + "echo 'calc.py filter=evil diff=evil' > .gitattributes\n"
        + f"cat >> .git/config <<'EOF'\n{evil}EOF\n"
        + "printf 'a * b\\n' > calc.py\n"
        + diff_script()
    )
    out = _run(docker_client, sandbox_image, pool_name, script)
    assert "CHECKOUT-FAILED" not in out, out
    assert "+a * b" in out, out
    for marker in ("FILTER-42", "TEXTCONV-42", "DRIVER-42", "EXTERNAL-42"):
        assert marker not in out, (marker, out)
