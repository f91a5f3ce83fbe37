"""The `deckhands` command's arguments and configuration, without a gateway (Typer's CliRunner).

Requests that would reach a gateway are sent to a port nothing listens on: the command must
say it cannot reach it (exit 6), which shows the URL and key it chose without a server.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from tools.cli.app import Exit, app
from tools.cli.config import DEFAULT_URL, ConfigError, config_path, resolve
from tools.cli.render import bounded, event_renderable
from tools.procs import free_port

pytestmark = pytest.mark.timeout(60)

KEY = "dh_0123456789ab_" + "k" * 43


@pytest.fixture
def runner() -> CliRunner:
    return CliRunner()


@pytest.fixture
def no_config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """No config file, no environment: what a fresh shell has."""
    for name in ("DECKHANDS_URL", "DECKHANDS_API_KEY", "DECKHANDS_CONFIG"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    return tmp_path


def _nowhere() -> str:
    return f"http://127.0.0.1:{free_port()}"


# --- where the URL and the key come from ----------------------------------------------------


def test_flags_win_over_the_environment_and_the_file(no_config: Path) -> None:
    config = no_config / "config" / "deckhands" / "config.toml"
    config.parent.mkdir(parents=True)
    config.write_text('url = "http://file:1"\napi_key = "from-file"\n')
    env = {"DECKHANDS_URL": "http://env:2", "DECKHANDS_API_KEY": "from-env"}
    env["XDG_CONFIG_HOME"] = str(no_config / "config")
    missing = no_config / "absent"
    target = resolve("http://flag:3/", "from-flag", environ=env, checkout_key_file=missing)
    assert (target.url, target.api_key, target.key_from) == (
        "http://flag:3",
        "from-flag",
        "--api-key",
    )
    target = resolve(environ=env, checkout_key_file=missing)
    assert (target.url, target.api_key) == ("http://env:2", "from-env")
    del env["DECKHANDS_URL"], env["DECKHANDS_API_KEY"]
    target = resolve(environ=env, checkout_key_file=missing)
    assert (target.url, target.api_key, target.key_from) == (
        "http://file:1",
        "from-file",
        str(config),
    )


def test_the_checkout_key_and_url_are_the_last_resort(no_config: Path) -> None:
    key_file = no_config / "api_key"
    key_file.write_text(KEY + "\n")
    env = {"XDG_CONFIG_HOME": str(no_config / "config")}
    target = resolve(environ=env, checkout_key_file=key_file)
    assert (target.url, target.api_key, target.key_from) == (DEFAULT_URL, KEY, "make up")
    with pytest.raises(ConfigError, match="no API key: pass --api-key"):
        resolve(environ=env, checkout_key_file=no_config / "absent")


def test_a_config_file_may_name_a_key_file_and_is_checked(no_config: Path) -> None:
    secret = no_config / "secret"
    secret.write_text(KEY)
    config = no_config / "my.toml"
    config.write_text(f'api_key_file = "{secret}"\n')
    env = {"DECKHANDS_CONFIG": str(config)}
    assert config_path(env) == config
    assert resolve(environ=env, checkout_key_file=no_config / "absent").api_key == KEY
    config.write_text('api-key = "typo"\n')
    with pytest.raises(ConfigError, match="unknown setting"):
        resolve(environ=env)
    config.write_text("url = [1]\n")
    with pytest.raises(ConfigError, match="url must be a string"):
        resolve(environ=env)
    config.write_text("url = \n")
    with pytest.raises(ConfigError, match="cannot read the config file"):
        resolve(environ=env)
    with pytest.raises(ConfigError, match="must start with http"):
        resolve("ftp://x", "k", environ={})


# --- arguments -------------------------------------------------------------------------------


def test_help_lists_every_command(runner: CliRunner) -> None:
    result = runner.invoke(app, ["--help"])
    assert result.exit_code == 0
    for command in ("run", "tasks", "logs", "approve", "reject", "stop", "pause", "resume", "say"):
        assert command in result.output


def test_bad_arguments_are_usage_errors(runner: CliRunner, no_config: Path) -> None:
    assert runner.invoke(app, ["run"]).exit_code == Exit.USAGE  # no task
    assert runner.invoke(app, ["logs"]).exit_code == Exit.USAGE  # no id
    bad = runner.invoke(app, ["--api-key", KEY, "run", "x", "--max-iterations", "0"])
    assert bad.exit_code == Exit.USAGE
    bad = runner.invoke(app, ["--api-key", KEY, "run", "x", "--threshold", "extreme"])
    assert bad.exit_code == Exit.USAGE and "--threshold" in bad.output
    bad = runner.invoke(app, ["--api-key", KEY, "tasks", "--state", "DONE"])
    assert bad.exit_code == Exit.USAGE and "unknown state 'DONE'" in bad.output
    empty = runner.invoke(app, ["--api-key", KEY, "run", "   "])
    assert empty.exit_code == Exit.USAGE and "empty" in empty.output
    no_repo = runner.invoke(app, ["--api-key", KEY, "run", "x", "--ref", "main"])
    assert no_repo.exit_code == Exit.USAGE and "need --repo" in no_repo.output
    missing = runner.invoke(app, ["--api-key", KEY, "upload", "some-task", "/nonexistent.tgz"])
    assert missing.exit_code == Exit.USAGE


def test_no_key_anywhere_says_where_to_put_one(
    runner: CliRunner, no_config: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("tools.cli.config.CHECKOUT_KEY_FILE", no_config / "absent")
    result = runner.invoke(app, ["tasks"])
    assert result.exit_code == Exit.USAGE
    assert "DECKHANDS_API_KEY" in result.output and "make up" in result.output


def test_an_unreachable_gateway_is_named(runner: CliRunner, no_config: Path) -> None:
    url = _nowhere()
    result = runner.invoke(app, ["--url", url, "--api-key", KEY, "tasks"])
    assert result.exit_code == Exit.REFUSED
    assert f"cannot reach the gateway at {url}" in result.output
    env = {"DECKHANDS_URL": url, "DECKHANDS_API_KEY": KEY}
    result = runner.invoke(app, ["stop", "some-task"], env=env)
    assert result.exit_code == Exit.REFUSED and url in result.output


# --- rendering -------------------------------------------------------------------------------


def test_long_output_is_bounded_and_says_how_much_was_cut() -> None:
    text = "\n".join(f"line {i}" for i in range(1, 1001))
    shown = bounded(text, 40).split("\n")
    assert len(shown) == 41
    assert shown[0] == "line 1" and shown[-1] == "line 1000"
    assert "[960 lines not shown]" in shown[20]
    assert bounded("a\nb\n") == "a\nb"


def _plain(event: dict[str, object]) -> str:
    from rich.console import Console

    console = Console(width=100, record=True, color_system=None)
    console.print(event_renderable(event))
    return console.export_text()


def test_events_read_like_a_terminal_and_edits_like_diffs() -> None:
    run = _plain({"kind": "run", "seq": 4, "source": "AGENT", "command": "ls -la"})
    assert "$ ls -la" in run
    out = _plain(
        {
            "kind": "run_output",
            "seq": 5,
            "source": "ENVIRONMENT",
            "content": "boom\n",
            "exit_code": 2,
        }
    )
    assert "boom" in out and "exit 2" in out
    edit = _plain(
        {
            "kind": "edit_output",
            "seq": 6,
            "source": "ENVIRONMENT",
            "path": "/workspace/a.py",
            "diff": "--- a\n+++ b\n@@ -1 +1 @@\n-old\n+new",
        }
    )
    assert "-old" in edit and "+new" in edit
    write = _plain(
        {"kind": "write", "seq": 7, "source": "AGENT", "path": "a.py", "content": "x = 1\n"}
    )
    assert "+++ a.py" in write and "+x = 1" in write
    delegated = _plain(
        {
            "kind": "delegate_output",
            "seq": 8,
            "source": "ENVIRONMENT",
            "sub_task_id": "abc123",
            "agent_state": "FINISHED",
            "content": "computed 100",
        }
    )
    assert "sub-task abc123 ended FINISHED" in delegated and "computed 100" in delegated
    assert "{" not in delegated  # legible, not raw JSON
    mcp = _plain(
        {
            "kind": "mcp_call",
            "seq": 10,
            "source": "AGENT",
            "server": "tracker",
            "tool": "get_ticket",
            "arguments": {"id": "T-1"},
        }
    )
    assert "calls get_ticket (MCP server tracker)" in mcp and '"id": "T-1"' in mcp
    # Text from the agent is never taken for Rich markup.
    message = _plain({"kind": "message", "seq": 9, "source": "AGENT", "content": "[bold]x[/]"})
    assert "[bold]x[/]" in message
