"""How every service refuses a bad configuration: one line on stderr naming each wrong
`DECKHANDS_*` variable and what is wrong with it, then exit code 2 (a usage error, as for a
command line), never a traceback. The value itself is not repeated: it may be a secret."""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import NoReturn, TypeVar

from pydantic import ValidationError
from pydantic_settings import BaseSettings

__all__ = ["BAD_CONFIGURATION_EXIT", "describe_validation_error", "settings_or_exit"]

BAD_CONFIGURATION_EXIT = 2

S = TypeVar("S", bound=BaseSettings)


def describe_validation_error(settings_class: type[BaseSettings], exc: ValidationError) -> str:
    """`DECKHANDS_X: what is wrong; DECKHANDS_Y: ...`, in the order pydantic found them."""
    prefix = str(settings_class.model_config.get("env_prefix", ""))
    problems = []
    for error in exc.errors(include_input=False, include_url=False):
        location = error.get("loc") or ()
        if location:
            name = f"{prefix}{str(location[0]).upper()}"
            problems.append(f"{name}: {error['msg']}")
        else:  # a check across several variables: its message names them
            problems.append(str(error["msg"]))
    return "; ".join(problems)


def settings_or_exit(
    settings_class: type[S], service: str, check: Callable[[S], None] | None = None
) -> S:
    """The service's settings from the environment, or exit 2 with one line saying what is
    wrong. `check` adds a service's own requirement (it raises ValueError or RuntimeError)."""
    try:
        settings = settings_class()
        if check is not None:
            check(settings)
    except ValidationError as exc:
        _exit(service, describe_validation_error(settings_class, exc))
    except (ValueError, RuntimeError) as exc:
        _exit(service, str(exc))
    return settings


def _exit(service: str, problem: str) -> NoReturn:
    print(f"{service}: bad configuration: {problem}", file=sys.stderr, flush=True)
    raise SystemExit(BAD_CONFIGURATION_EXIT)
