"""Replacing a task's secret values with `<secret:NAME>` in what it produces.

Done at the source (the runtime's observation, before it is recorded or published, and the whole
outputs it keeps as blobs) and again where the log is written (the controller, for any input:
a user's message, the agent's action), so that a value never reaches an event, the log, the
trajectory export, or a prompt. Longer values are replaced first, so a secret that contains
another is named as itself.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, TypeVar

from pydantic import BaseModel

__all__ = ["Redactor", "placeholder"]

M = TypeVar("M", bound=BaseModel)
_PLACEHOLDER = re.compile(r"(<secret:[A-Za-z0-9_]{1,128}>)")


def placeholder(name: str) -> str:
    return f"<secret:{name}>"


class Redactor:
    def __init__(self, secrets: Mapping[str, str]) -> None:
        # Longest first; a value that two names share is named by the first in sorted order.
        self._pairs = sorted(
            ((value, placeholder(name)) for name, value in sorted(secrets.items()) if value),
            key=lambda pair: -len(pair[0]),
        )

    def __bool__(self) -> bool:
        return bool(self._pairs)

    def text(self, text: str) -> str:
        if not any(value in text for value, _ in self._pairs):
            return text
        # Placeholders already there stay as they are (redacting twice changes nothing, even
        # for a value that is part of a placeholder).
        parts = _PLACEHOLDER.split(text)
        for i in range(0, len(parts), 2):
            part = parts[i]
            for value, marker in self._pairs:
                if value in part:
                    part = part.replace(value, marker)
            parts[i] = part
        return "".join(parts)

    def data(self, data: bytes) -> bytes:
        """Bytes of UTF-8 text (a kept output): the same replacement, byte for byte."""
        for value, marker in self._pairs:
            raw = value.encode()
            if raw in data:
                data = data.replace(raw, marker.encode())
        return data

    def _walk(self, value: Any) -> Any:
        if isinstance(value, str):
            return self.text(value)
        if isinstance(value, list | tuple):
            return type(value)(self._walk(v) for v in value)
        if isinstance(value, dict):
            return {k: self._walk(v) for k, v in value.items()}
        return value

    def model(self, model: M) -> M:
        """The model with every string in it redacted; the same object when none changed."""
        if not self._pairs:
            return model
        dumped = model.model_dump(mode="json")
        walked = self._walk(dumped)
        if walked == dumped:
            return model
        return type(model).model_validate(walked)
