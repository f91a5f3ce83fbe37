"""Replacing a task's secret values with `<secret:NAME>` in what it produces.

Done at the source (the runtime's observation, before it is recorded or published, the whole
outputs it keeps as blobs, and the repository instructions it keeps for the prompt) and again
where the log is written (the controller, for any input: a user's message, the agent's action),
so that a value never reaches an event, the log, the trajectory export, or a prompt.

A value is looked for in every form a program commonly prints it in, not only as it is:

- shell-quoted, as bash prints it (`set -x`, `declare -p`, `printf %q`) and as scripts quote it:
  inside single quotes (`'\\''` and Python's `shlex.quote` `'"'"'` for a quote), inside double
  quotes (backslash before `\\ " $ \\``), ANSI-C `$'...'` (bash's escapes, non-ASCII as it is or
  as octal bytes) and `printf %q`'s backslash form;
- JSON-escaped (the inside of `json.dumps`, with and without `ensure_ascii`) and Python-escaped
  (the inside of `repr`);
- URL-encoded (`quote`, with and without `/` kept, and `quote_plus`; upper- and lower-case hex).

A quoted form that wraps the value exactly (`'it'\\''s'`, `$'a\\nb'`, `"a\\$b"`) is replaced
quotes and all. Where matches overlap (two secrets, or two forms), the whole stretch they cover
is replaced, named after its longest match, so no part of any value survives; a secret that
contains another is named as itself.

Cost: the forms are worked out once per Redactor; `text` first checks each distinct form with
`in` (a plain value has one or two distinct forms) and does nothing more when none is there,
which is the case for almost every observation.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any, TypeVar
from urllib.parse import quote, quote_plus

from pydantic import BaseModel

__all__ = ["Redactor", "placeholder", "secret_forms"]

M = TypeVar("M", bound=BaseModel)
_PLACEHOLDER = re.compile(r"(<secret:[A-Za-z0-9_]{1,128}>)")

# bash's ansic_quote (lib/sh/strtrans.c): these get a letter, other non-printables octal.
_ANSI_C = {
    "\x1b": "\\E",
    "\a": "\\a",
    "\v": "\\v",
    "\b": "\\b",
    "\f": "\\f",
    "\n": "\\n",
    "\r": "\\r",
    "\t": "\\t",
    "\\": "\\\\",
    "'": "\\'",
}
# bash's sh_backslash_quote (lib/sh/shquote.c), as `printf %q` uses it for printable strings.
_BACKSLASHED = frozenset(" \t\n'\"\\|&;()<>!{}*[?]^$`,")
_DOUBLE_QUOTED = re.compile(r'([\\"$`])')
_PERCENT = re.compile(r"%[0-9A-F]{2}")


def placeholder(name: str) -> str:
    return f"<secret:{name}>"


def _octal(ch: str) -> str:
    return "".join(f"\\{b:03o}" for b in ch.encode("utf-8", "surrogatepass"))


def _ansi_c(value: str, utf8: bool) -> str:
    out = []
    for ch in value:
        if ch in _ANSI_C:
            out.append(_ANSI_C[ch])
        elif " " <= ch <= "~" or (utf8 and ord(ch) > 0x7F and ch.isprintable()):
            out.append(ch)
        else:
            out.append(_octal(ch))
    return "".join(out)


def _backslashed(value: str, at_start: bool) -> str:
    out = []
    for i, ch in enumerate(value):
        before = value[i - 1] if i else ""
        if ch in _BACKSLASHED:
            out.append("\\" + ch)
        elif ch == "~" and ((at_start and i == 0) or before in ("=", ":")):
            out.append("\\~")
        elif ch == "#" and at_start and i == 0:
            out.append("\\#")
        else:
            out.append(ch)
    return "".join(out)


def _python_escaped(value: str, quote_char: str) -> str:
    out = []
    for ch in value:
        if ch == "\\" or ch == quote_char:
            out.append("\\" + ch)
        elif ch.isprintable():
            out.append(ch)
        else:
            out.append(repr(ch)[1:-1])
    return "".join(out)


def secret_forms(value: str) -> tuple[list[str], list[str]]:
    """(inner forms, whole quoted tokens) of `value`, the raw value first, without repeats.

    An inner form is how the value appears inside a quoted or encoded string; a whole token is
    a quoted form that begins and ends with its quotes (only those whose inside differs from
    the raw value: `"abc"` stays a JSON string with `<secret:NAME>` inside, not a bare name).
    """
    single = value.replace("'", "'\\''")
    shlex_single = value.replace("'", "'\"'\"'")
    double = _DOUBLE_QUOTED.sub(r"\\\1", value)
    ansi_c = {_ansi_c(value, utf8=True), _ansi_c(value, utf8=False)}
    inner = [
        value,
        single,
        shlex_single,  # shlex.quote
        double,
        *sorted(ansi_c),
        _backslashed(value, at_start=True),
        _backslashed(value, at_start=False),
        json.dumps(value)[1:-1],
        json.dumps(value, ensure_ascii=False)[1:-1],
        _python_escaped(value, "'"),
        _python_escaped(value, '"'),
    ]
    for encoded in (quote(value, safe=""), quote(value), quote_plus(value)):
        inner.append(encoded)
        inner.append(_PERCENT.sub(lambda m: m.group(0).lower(), encoded))
    whole = []
    if single != value:
        whole.append(f"'{single}'")
    if shlex_single != value:
        whole.append(f"'{shlex_single}'")
    if double != value:
        whole.append(f'"{double}"')
    whole.extend(f"$'{form}'" for form in sorted(ansi_c) if form != value)
    return list(dict.fromkeys(inner)), [w for w in dict.fromkeys(whole) if w not in inner]


class Redactor:
    def __init__(self, secrets: Mapping[str, str]) -> None:
        # Every form of every value, longest first; a form that two names share (the same
        # value, or one secret's encoding that is another's value) is named by the first name
        # in sorted order.
        forms: dict[str, str] = {}
        for name, value in sorted(secrets.items()):
            if not value:
                continue
            inner, whole = secret_forms(value)
            for form in (*whole, *inner):
                forms.setdefault(form, placeholder(name))
        self._forms = sorted(forms.items(), key=lambda pair: -len(pair[0]))
        self._encoded = [form.encode("utf-8", "surrogatepass") for form, _ in self._forms]

    def __bool__(self) -> bool:
        return bool(self._forms)

    def _present(self, text: str) -> list[tuple[str, str]]:
        return [pair for pair in self._forms if pair[0] in text]

    def text(self, text: str, cut_end: bool = False) -> str:
        """`text` with every form of every value replaced. `cut_end`: the text was cut at its
        end (a bounded read), so a value's beginning at the very end, what is left of a value
        the cut went through, is replaced too."""
        if cut_end:
            text = self._cut_end(text)
        present = self._present(text)
        if not present:
            return text
        # Placeholders already there stay as they are (redacting twice changes nothing, even
        # for a value that is part of a placeholder).
        parts = _PLACEHOLDER.split(text)
        for i in range(0, len(parts), 2):
            if parts[i]:
                parts[i] = self._replace(parts[i], present)
        return "".join(parts)

    def _cut_end(self, text: str) -> str:
        """`text` with its longest end that begins some form (and is shorter than it) replaced
        by that form's placeholder."""
        longest, marker = 0, ""
        for form, name in self._forms:
            window = text[-(len(form) - 1) :] if len(form) > 1 else ""
            at = window.find(form[0])
            while at >= 0:
                if len(window) - at <= longest:
                    break
                if form.startswith(window[at:]):
                    longest, marker = len(window) - at, name
                    break
                at = window.find(form[0], at + 1)
        return text[:-longest] + marker if longest else text

    @staticmethod
    def _replace(part: str, present: list[tuple[str, str]]) -> str:
        # Every occurrence of every form present (overlaps included), as (start, end, rank):
        # a lower rank is a longer form.
        spans: list[tuple[int, int, int]] = []
        for rank, (form, _) in enumerate(present):
            at = part.find(form)
            while at >= 0:
                spans.append((at, at + len(form), rank))
                at = part.find(form, at + 1)
        if not spans:
            return part
        spans.sort()
        out: list[str] = []
        done = 0
        start, end, best = spans[0]
        for s, e, rank in spans[1:]:
            if s < end:  # overlaps the stretch: one stretch, one placeholder
                end = max(end, e)
                best = min(best, rank)
                continue
            out += [part[done:start], present[best][1]]
            done, (start, end, best) = end, (s, e, rank)
        out += [part[done:start], present[best][1], part[end:]]
        return "".join(out)

    def data(self, data: bytes) -> bytes:
        """Bytes of UTF-8 text (a kept output): the same replacement; bytes that are not UTF-8
        are kept as they are."""
        if not any(form in data for form in self._encoded):
            return data
        return self.text(data.decode("utf-8", "surrogateescape")).encode("utf-8", "surrogateescape")

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
        if not self._forms:
            return model
        dumped = model.model_dump(mode="json")
        walked = self._walk(dumped)
        if walked == dumped:
            return model
        return type(model).model_validate(walked)
