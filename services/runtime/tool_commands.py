"""The V1 tools that run in the sandbox (issue 29, item 4), as the bash they run in the task's
shell: glob and grep through ripgrep (which leaves out what .gitignore names, and .git), a
patch through `git apply` (every hunk or none: it checks the whole patch before it writes, and
names the hunk that does not apply). Each runs in a subshell from /workspace, so the agent's
shell keeps its directory; every argument is quoted, never spliced."""

from __future__ import annotations

import re
import secrets
import shlex

from shared.events import ApplyPatchAction, GlobAction, GrepAction

__all__ = ["MAX_FILES", "MAX_LINES", "glob_command", "grep_command", "patch_command"]

MAX_FILES = 100  # paths a glob lists at most
MAX_LINES = 200  # lines a grep shows at most
_RG = "rg --hidden --no-config --no-require-git --color never -g '!.git'"


def _bounded(search: str, limit: int, none: str, more: str) -> str:
    """Run `search` (ripgrep: 0 found, 1 nothing, 2 an error), print at most `limit` lines."""
    return (
        f"out=$({search} 2>&1); rc=$?; "
        f'if [ $rc -gt 1 ]; then printf "%s\\n" "$out"; exit $rc; fi; '
        f'n=$(printf "%s" "$out" | grep -c .); '
        f'if [ "$n" -eq 0 ]; then echo {shlex.quote(none)}; exit 0; fi; '
        f'printf "%s\\n" "$out" | head -n {limit}; '
        f'if [ "$n" -gt {limit} ]; then echo "[... $((n - {limit})) more {more}]"; fi'
    )


def glob_command(action: GlobAction) -> str:
    where = shlex.quote(action.path or ".")
    search = f"{_RG} --files --sortr modified -g {shlex.quote(action.pattern)} </dev/null"
    listing = _bounded(
        search, MAX_FILES, f"No file matches {action.pattern}", "files: narrow the pattern"
    )
    return f"(cd /workspace && cd -- {where} && {{ {listing}; }})"


def grep_command(action: GrepAction) -> str:
    # No path: the working directory, its files named as they are (not ./x). Its stdin is not
    # the shell's: given a pipe, ripgrep would search that instead.
    where = f" -- {shlex.quote(action.path)}" if action.path else ""
    only = f" -g {shlex.quote(action.include)}" if action.include else ""
    search = (
        f"{_RG} -n --max-columns 300 --max-columns-preview{only} "
        f"-e {shlex.quote(action.pattern)}{where} </dev/null"
    )
    found = _bounded(
        search, MAX_LINES, f"No line matches {action.pattern}", "lines: narrow the search"
    )
    return f"(cd /workspace && {{ {found}; }})"


_HEADER = re.compile(r"^(?:---|\+\+\+) (\S+)", re.MULTILINE)


def patch_command(action: ApplyPatchAction) -> str:
    patch = action.patch if action.patch.endswith("\n") else action.patch + "\n"
    end = f"DECKHANDS_PATCH_{secrets.token_hex(8)}"
    while end in patch:
        end = f"DECKHANDS_PATCH_{secrets.token_hex(8)}"
    # `git diff` names files a/x and b/x; a patch written by hand often names them x.
    paths = [p for p in _HEADER.findall(patch) if p != "/dev/null"]
    strip = "" if any(p.startswith(("a/", "b/")) for p in paths) or not paths else " -p0"
    return (
        f"(cd /workspace && git apply --verbose --whitespace=nowarn{strip} - "
        f"<<'{end}'\n{patch}{end}\n)"
    )
