"""Where one command needs to connect (issue 27, item 6): the hosts of the package index it
installs from, the repository it fetches, the URL it downloads. The verdict records them as the
action's network scope; the controller narrows the task's egress policy to them for that action
only (shared/state.py, ActionScope), so that `pip install` reaches the index and nothing else
the task may reach.

A pure function of the command's text. It narrows only what it understands: a command with a
part it cannot place (a script, a program that may connect anywhere) gets no scope (None), and
runs with the task's whole policy. Parts that never connect (`cd`, `ls`, `echo`...) need
nothing; a command made only of them gets an empty scope.
"""

from __future__ import annotations

import shlex

from shared.events import CmdRunAction, RunnableAction, RunPythonAction

from .cell_scope import cell_scope
from .url_rules import host_rule

__all__ = ["network_scope"]

PYPI = ("pypi.org:443", "files.pythonhosted.org:443")
NPM = ("registry.npmjs.org:443",)
# Commands that never open a connection themselves, nor run another command (not `env`,
# `xargs`, `find` with -exec, `sed`'s `e`, gawk's /inet files: those may connect anywhere).
_LOCAL = frozenset(
    {
        "cd", "ls", "pwd", "echo", "printf", "cat", "head", "tail", "wc", "sort", "uniq", "grep",
        "mkdir", "rm", "rmdir", "cp", "mv", "touch", "chmod", "true", "false", "test", "[",
        "export", "set", "unset", "which", "tee", "tr", "cut", "diff", "date", "sleep", "tar",
        "unzip", "gzip", "gunzip", "ln", "stat", "du", "df", "file", "basename", "dirname",
        "realpath",
    }
)  # fmt: skip
_PIP_URL_FLAGS = ("-i", "--index-url", "--extra-index-url", "-f", "--find-links")
_GIT_NETWORK = frozenset({"clone", "fetch", "pull", "push", "ls-remote", "submodule"})
_PUNCTUATION = ";&|<>"


def _urls(words: list[str]) -> list[str]:
    return [r for w in words if (r := host_rule(w)) is not None]


def _flag_values(words: list[str], flags: tuple[str, ...]) -> list[str]:
    values = []
    for i, word in enumerate(words):
        for flag in flags:
            if word == flag and i + 1 < len(words):
                values.append(words[i + 1])
            elif word.startswith(flag + "="):
                values.append(word.split("=", 1)[1])
    return values


def _pip(words: list[str]) -> list[str] | None:
    if "install" not in words and "download" not in words:
        return None
    indexes = _urls(_flag_values(words, _PIP_URL_FLAGS))
    given = "-i" in words or any(w.startswith(("--index-url", "-i")) for w in words)
    return [*(() if given else PYPI), *indexes, *_urls(words)]


def _npm(words: list[str]) -> list[str] | None:
    if not {"install", "i", "ci", "add", "update"} & set(words[1:3]):
        return None
    registry = _urls(_flag_values(words, ("--registry",)))
    return [*(registry or NPM), *_urls(words)]


def _git(words: list[str]) -> list[str] | None:
    rest = words[1:]
    while rest and rest[0].startswith("-"):  # git's own options, `-C dir` and `-c k=v` with theirs
        rest = rest[2:] if rest[0] in ("-C", "-c") else rest[1:]
    sub = rest[0] if rest else ""
    if sub not in _GIT_NETWORK:
        return [] if sub else None
    hosts = _urls(words)
    return hosts or None  # a remote named by name: where it points is not in the command


def _part_scope(words: list[str]) -> list[str] | None:
    """The hosts one simple command needs; None: it cannot be placed."""
    comment = next((i for i, w in enumerate(words) if w.startswith("#")), None)
    words = words if comment is None else words[:comment]
    while words and "=" in words[0] and not words[0].startswith("-"):
        words = words[1:]  # VAR=value prefixes
    if not words:
        return []
    program = words[0].rsplit("/", 1)[-1]
    if program in _LOCAL:
        return []
    if program in ("pip", "pip3"):
        return _pip(words)
    if program.startswith("python") and words[1:3] == ["-m", "pip"]:
        return _pip(words[2:])
    if program in ("npm", "yarn", "pnpm"):
        return _npm(words)
    if program == "git":
        return _git(words)
    if program in ("curl", "wget"):
        return _urls(words) or None
    return None


def network_scope(action: RunnableAction) -> tuple[str, ...] | None:
    """The egress rules the action needs, or None when it cannot be told (the task's whole
    policy applies)."""
    if isinstance(action, RunPythonAction):
        return cell_scope(action.code)
    if not isinstance(action, CmdRunAction):
        return None
    try:
        # A line break separates commands, as `;` does.
        lexer = shlex.shlex(action.command, posix=True, punctuation_chars=_PUNCTUATION + "\n")
        lexer.whitespace_split = True
        lexer.whitespace = " \t\r"
        lexer.commenters = ""  # `#` starts a comment at a word's start only (`${t#x}` is none)
        tokens = list(lexer)
    except ValueError:
        return None
    rules: list[str] = []
    part: list[str] = []
    skip = False
    for token in [*tokens, ";"]:
        operator = bool(token) and all(ch in _PUNCTUATION + "\n" for ch in token)
        if skip and not operator:
            skip = False  # a redirection's target (`> out.txt`, `2>&1`'s 1)
        elif operator and ("<" in token or ">" in token):
            if part and part[-1].isdigit():
                part.pop()  # the descriptor of `2>`
            skip = True
        elif not operator:
            part.append(token)
        else:
            found = _part_scope(part)
            if found is None:
                return None
            rules.extend(found)
            part, skip = [], False
    return tuple(dict.fromkeys(rules))  # () for a command that never connects
