"""The first rule set: patterns that are never allowed, and a risk rating for the rest.

Rules look at what an action would do, not at who asked; each returns a `Finding` or None.
"""

from __future__ import annotations

import json
import posixpath
import re
from collections.abc import Callable
from dataclasses import dataclass

from shared.events import (
    ApplyPatchAction,
    CmdRunAction,
    FileEditAction,
    FileReadAction,
    FileWriteAction,
    GlobAction,
    GrepAction,
    MCPCallAction,
    RiskLevel,
    RunPythonAction,
    Verdict,
)

__all__ = ["Finding", "review"]

Reviewable = (
    CmdRunAction
    | RunPythonAction
    | FileReadAction
    | FileWriteAction
    | FileEditAction
    | MCPCallAction
    | GlobAction
    | GrepAction
    | ApplyPatchAction
)


@dataclass(frozen=True)
class Finding:
    verdict: Verdict
    risk: RiskLevel
    rule: str | None
    reason: str


def _deny(rule: str, reason: str) -> Finding:
    return Finding(Verdict.DENY, RiskLevel.HIGH, rule, reason)


_RM_ROOT = re.compile(
    r"\brm\s+(?=[^;&|]*-\w*[rR])[^;&|]*?(\s|^)(--no-preserve-root|/\*?|~/?|\$HOME/?|/\s*\*)(\s|$|;|&|\|)"
)
_FORK_BOMB = re.compile(r"(\w+|:)\s*\(\)\s*\{\s*\1\s*\|\s*\1\s*&\s*\}\s*;\s*\1")
_DISK_WIPE = re.compile(r"\b(mkfs(\.\w+)?|wipefs)\b|\bdd\b[^;&|]*\bof=/dev/(sd|nvme|vd|hd|xvd)")
_POWER = re.compile(r"(^|[;&|]\s*|\bsudo\s+)(shutdown|reboot|halt|poweroff)\b")
_CHMOD_ROOT = re.compile(r"\bchmod\s+-R\s+[0-7]{3,4}\s+/(\s|$)")
_PY_RMTREE_ROOT = re.compile(r"rmtree\(\s*['\"](/|~)['\"]")
_PY_SHELL = re.compile(r"\b(os\.system|subprocess\.\w+|os\.popen)\s*\(")
_NETWORK = re.compile(
    r"\b(curl|wget|nc|ssh|scp|git\s+clone|pip\d*\s+install|apt(-get)?\s+install)\b"
)
_PRIVILEGE = re.compile(r"\b(sudo|su|chown|chmod)\b")


def _command_findings(command: str) -> Finding | None:
    if _FORK_BOMB.search(command):
        return _deny("fork_bomb", "the command is a fork bomb")
    if _RM_ROOT.search(command):
        return _deny("delete_root", "the command recursively deletes / or the home directory")
    if _DISK_WIPE.search(command):
        return _deny("disk_wipe", "the command formats or overwrites a disk")
    if _POWER.search(command):
        return _deny("power", "the command shuts down or reboots the machine")
    if _CHMOD_ROOT.search(command):
        return _deny("chmod_root", "the command changes permissions of the whole filesystem")
    return None


def _rate(text: str) -> RiskLevel:
    if _NETWORK.search(text) or _PRIVILEGE.search(text):
        return RiskLevel.MEDIUM
    return RiskLevel.LOW


def _outside_workspace(path: str, workspace: str) -> bool:
    absolute = path if path.startswith("/") else posixpath.join(workspace, path)
    normal = posixpath.normpath(absolute)
    return not (normal == workspace or normal.startswith(workspace.rstrip("/") + "/"))


def _review_cmd(action: CmdRunAction, workspace: str) -> Finding:
    found = _command_findings(action.command)
    return found or Finding(Verdict.ALLOW, _rate(action.command), None, "")


def _review_python(action: RunPythonAction, workspace: str) -> Finding:
    if _PY_RMTREE_ROOT.search(action.code):
        return _deny("delete_root", "the code recursively deletes / or the home directory")
    found = _command_findings(action.code)
    if found:
        return found
    risk = RiskLevel.MEDIUM if _PY_SHELL.search(action.code) else _rate(action.code)
    return Finding(Verdict.ALLOW, risk, None, "")


def _review_write(action: FileWriteAction, workspace: str) -> Finding:
    if _outside_workspace(action.path, workspace):
        return _deny(
            "write_outside_workspace", f"{action.path!r} is outside the workspace {workspace}"
        )
    return Finding(Verdict.ALLOW, RiskLevel.LOW, None, "")


def _review_edit(action: FileEditAction, workspace: str) -> Finding:
    if action.command != "view" and _outside_workspace(action.path, workspace):
        return _deny(
            "write_outside_workspace", f"{action.path!r} is outside the workspace {workspace}"
        )
    return Finding(Verdict.ALLOW, RiskLevel.LOW, None, "")


def _review_read(action: FileReadAction, workspace: str) -> Finding:
    return Finding(Verdict.ALLOW, RiskLevel.LOW, None, "")


def _review_search(action: GlobAction | GrepAction, workspace: str) -> Finding:
    return Finding(Verdict.ALLOW, RiskLevel.LOW, None, "")


_PATCHED_PATH = re.compile(r"^(?:\+\+\+|---) (?:[ab]/)?(\S+)", re.MULTILINE)


def _review_patch(action: ApplyPatchAction, workspace: str) -> Finding:
    """A patch writes the files its headers name: each must be in the workspace."""
    for path in _PATCHED_PATH.findall(action.patch):
        if path == "/dev/null":
            continue
        if _outside_workspace(path, workspace):
            return _deny(
                "write_outside_workspace", f"{path!r} is outside the workspace {workspace}"
            )
    return Finding(Verdict.ALLOW, RiskLevel.LOW, None, "")


def _review_mcp(action: MCPCallAction, workspace: str) -> Finding:
    """A tool of a server the operator configured: what it does is the server's, so it is rated
    MEDIUM (confirmation mode set to MEDIUM asks a person first), and arguments holding a
    never-allowed command are refused as they would be in a shell."""
    found = _command_findings(json.dumps(action.arguments, ensure_ascii=False))
    if found:
        return found
    return Finding(
        Verdict.ALLOW, RiskLevel.MEDIUM, None, f"a tool of the MCP server {action.server!r}"
    )


_REVIEWERS: dict[type, Callable[..., Finding]] = {
    CmdRunAction: _review_cmd,
    RunPythonAction: _review_python,
    FileWriteAction: _review_write,
    FileReadAction: _review_read,
    FileEditAction: _review_edit,
    MCPCallAction: _review_mcp,
    GlobAction: _review_search,
    GrepAction: _review_search,
    ApplyPatchAction: _review_patch,
}


def review(action: Reviewable, workspace: str = "/workspace") -> Finding:
    reviewer = _REVIEWERS.get(type(action))
    if reviewer is None:
        return Finding(Verdict.ALLOW, RiskLevel.UNKNOWN, None, "no rule covers this action kind")
    return reviewer(action, workspace)
