"""Where the `deckhands` command finds the gateway and its API key.

Each of the two is taken from the first place that has it:

1. the flags `--url` and `--api-key` (or `--api-key-file`);
2. the environment: `DECKHANDS_URL`, `DECKHANDS_API_KEY`;
3. the config file, `$DECKHANDS_CONFIG`, else `$XDG_CONFIG_HOME/deckhands/config.toml`
   (`~/.config/deckhands/config.toml`)::

       url = "https://deckhands.example.com"
       api_key = "dh_..."          # or: api_key_file = "~/.secrets/deckhands"

4. in a deckhands checkout, what `make up` left: `.run/api_key` and http://127.0.0.1:8000.
"""

from __future__ import annotations

import os
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

__all__ = ["CHECKOUT_KEY_FILE", "DEFAULT_URL", "ConfigError", "Target", "config_path", "resolve"]

DEFAULT_URL = "http://127.0.0.1:8000"
CHECKOUT_KEY_FILE = Path(__file__).resolve().parents[2] / ".run" / "api_key"


class ConfigError(Exception):
    """The command cannot know where to go or with which key; the message says what to set."""


@dataclass(frozen=True)
class Target:
    url: str
    api_key: str
    key_from: str  # where the key came from, for messages (never the key itself)


def config_path(environ: Mapping[str, str] | None = None) -> Path:
    env = os.environ if environ is None else environ
    if env.get("DECKHANDS_CONFIG"):
        return Path(env["DECKHANDS_CONFIG"]).expanduser()
    base = Path(env["XDG_CONFIG_HOME"]) if env.get("XDG_CONFIG_HOME") else Path.home() / ".config"
    return base / "deckhands" / "config.toml"


def _read_file_config(path: Path) -> dict[str, str]:
    if not path.exists():
        return {}
    try:
        data = tomllib.loads(path.read_text())
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(f"cannot read the config file {path}: {exc}") from exc
    known = {"url", "api_key", "api_key_file"}
    unknown = sorted(set(data) - known)
    if unknown:
        raise ConfigError(
            f"{path}: unknown setting(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}"
        )
    for name, value in data.items():
        if not isinstance(value, str):
            raise ConfigError(f"{path}: {name} must be a string")
    return dict(data)


def _read_key_file(path: Path, what: str) -> str:
    try:
        key = path.expanduser().read_text().strip()
    except OSError as exc:
        raise ConfigError(f"cannot read the API key file {path} ({what}): {exc}") from exc
    if not key:
        raise ConfigError(f"the API key file {path} ({what}) is empty")
    return key


def resolve(
    url: str | None = None,
    api_key: str | None = None,
    api_key_file: Path | None = None,
    environ: Mapping[str, str] | None = None,
    checkout_key_file: Path | None = None,
) -> Target:
    env = os.environ if environ is None else environ
    checkout_key_file = checkout_key_file or CHECKOUT_KEY_FILE
    path = config_path(env)
    file_config = _read_file_config(path)

    chosen_url = url or env.get("DECKHANDS_URL") or file_config.get("url") or DEFAULT_URL
    chosen_url = chosen_url.rstrip("/")
    if not chosen_url.startswith(("http://", "https://")):
        raise ConfigError(f"the gateway URL {chosen_url!r} must start with http:// or https://")

    if api_key:
        return Target(chosen_url, api_key.strip(), "--api-key")
    if api_key_file is not None:
        return Target(chosen_url, _read_key_file(api_key_file, "--api-key-file"), str(api_key_file))
    if env.get("DECKHANDS_API_KEY"):
        return Target(chosen_url, env["DECKHANDS_API_KEY"].strip(), "DECKHANDS_API_KEY")
    if file_config.get("api_key"):
        return Target(chosen_url, file_config["api_key"].strip(), str(path))
    if file_config.get("api_key_file"):
        key_file = Path(file_config["api_key_file"])
        return Target(chosen_url, _read_key_file(key_file, str(path)), str(key_file))
    if checkout_key_file.exists():
        return Target(chosen_url, _read_key_file(checkout_key_file, "make up"), "make up")
    raise ConfigError(
        "no API key: pass --api-key, set DECKHANDS_API_KEY, put api_key in "
        f"{path}, or run `make up` in a deckhands checkout (it writes .run/api_key)"
    )
