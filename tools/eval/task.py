"""One evaluation task, and the pieces its checks are made of. The set is in tasks.py.

A task gives the agent a prompt and, when it needs them, starting files (served to the task as a
git repository, checked out into /workspace before its first action). Its `check` is a bash
command run after the agent finished, in a fresh container of the sandbox image holding a copy
of the task's final /workspace (the working directory) and /check: the task's `check_files`
(hidden from the agent: reference tests, other input data, expected output) and
`final_message.txt` (what the agent said when it finished). Exit code 0 passes; anything else
fails. No LLM judges.

Each task also carries a reference `solution` (the check passes after it) and a `cheat`: what
only prints or writes the expected result without doing the work (a program that prints the
expected line, tests rewritten to pass, the answer said but the file not written). The check
must fail on the cheat as it fails on the starting files (tests/integration/test_eval_checks.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["KINDS", "SPLITS", "EvalTask", "hidden_tests", "lines", "no_literal", "pass_only"]

SPLITS = ("dev", "heldout")
KINDS = ("script", "bugfix", "tests", "edit", "shell", "multi-file", "data", "reading")


@dataclass(frozen=True)
class EvalTask:
    id: str
    kind: str  # one of KINDS
    # "dev": the prompts and tools are tuned on it; "heldout": never looked at for that, so its
    # pass rate says how the agent does on tasks nobody tuned it for.
    split: str
    prompt: str
    check: str
    files: dict[str, str] = field(default_factory=dict)
    check_files: dict[str, str] = field(default_factory=dict)
    max_iterations: int = 30
    # A reference solution (a bash command in /workspace) and the final message that goes with
    # it: the tests check that it passes and the starting files fail, and the scripted LLM's
    # demo conversation (scripted.py) runs it.
    solution: str = ""
    solution_files: dict[str, str] = field(default_factory=dict)  # written before `solution`
    answer: str = "Done."
    # The cheat (a bash command, after `cheat_files` are written) and its final message (the
    # answer's when empty): the expected result without the work. The check fails on it.
    cheat: str = ""
    cheat_files: dict[str, str] = field(default_factory=dict)
    cheat_answer: str = ""


def no_literal(path: str, *numbers: str) -> str:
    """A part of a check: the program `path` does not hold all of `numbers`, the expected output
    written in rather than computed (a program of a task without input prints a constant)."""
    found = " && ".join(f"grep -Eq '(^|[^0-9]){n}([^0-9]|$)' {path}" for n in numbers)
    said = f"{path} holds {' '.join(numbers)}: its output is written in, not computed"
    return f"{{ ! {{ {found}; }} || {{ echo '{said}'; false; }}; }}"


def lines(*expected: str) -> str:
    """The output a check expects, as a bash word: `test "$(python x.py)" = <this>`."""
    return "\"$(printf '%s\\n' " + " ".join(f"'{line}'" for line in expected) + ')"'


def hidden_tests(name: str) -> str:
    """A check: the check's own copy of a test module (/check/`name`) passes on the workspace's
    code, so that tests the agent edited or deleted do not count."""
    return f"PYTHONPATH=/workspace python -m pytest -q -p no:cacheprovider /check/{name}"


def pass_only(tests: str) -> str:
    """A cheat: replace the test module `tests` with one that passes, and run pytest."""
    return f"printf 'def test_ok():\\n    pass\\n' > {tests} && python -m pytest -q"
