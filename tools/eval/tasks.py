"""The evaluation's task set: small, self-contained coding tasks, each with an automatic check.

A task gives the agent a prompt and, when it needs them, starting files (served to the task as a
git repository, checked out into /workspace before its first action). Its `check` is a bash
command run after the agent finished, in a fresh container of the sandbox image holding a copy
of the task's final /workspace (the working directory) and /check: the task's `check_files`
(hidden from the agent: reference tests, expected output) and `final_message.txt` (what the
agent said when it finished). Exit code 0 passes; anything else fails. No LLM judges.

`HEADLINE` is the fixed subset of 10 whose pass rate is the headline figure.
"""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["HEADLINE", "TASKS", "EvalTask", "select"]


@dataclass(frozen=True)
class EvalTask:
    id: str
    kind: str  # script, bugfix, tests, edit, shell, multi-file
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


_CALC_TEST = """from calc import add, mul


def test_add():
    assert add(2, 3) == 5
    assert add(-1, 1) == 0


def test_mul():
    assert mul(4, 5) == 20
"""

_STATS_TEST = """from stats import mean, median


def test_mean():
    assert mean([1, 2, 3, 4]) == 2.5


def test_median():
    assert median([5, 1, 3]) == 3
    assert median([4, 1, 3, 2]) == 2.5
"""

_PALINDROME_TEST = """from strings import is_palindrome


def test_is_palindrome():
    assert is_palindrome("Never odd or even")
    assert is_palindrome("abba")
    assert not is_palindrome("abc")
"""

_SHAPES = """def sq_area(side):
    return side * side
"""

_MAIN = """from shapes import sq_area

print(sq_area(3))
"""

_REPORT_PY = """import json

with open("scores.json") as f:
    scores = json.load(f)

best = max(scores, key=lambda s: s["score"]
print(f"best: {best['name']} {best['score']}")
"""

_GREET_PY = """import argparse


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("name")
    args = parser.parse_args()
    print(f"Hello, {args.name}!")


if __name__ == "__main__":
    main()
"""

_TEXTUTIL = """import re


def slugify(text):
    \"\"\"'Hello World!' -> 'hello-world'\"\"\"
    words = re.findall(r"[a-z0-9]+", text.lower())
    return "-".join(words)
"""

_PATCH = """--- a/version.py
+++ b/version.py
@@ -1,2 +1,2 @@
-VERSION = "1.0.0"
+VERSION = "1.1.0"
 NAME = "tool"
"""

_SLUGIFY_TESTS = """import unittest

from textutil import slugify


class SlugifyTest(unittest.TestCase):
    def test_words(self):
        self.assertEqual(slugify("Hello World!"), "hello-world")


if __name__ == "__main__":
    unittest.main()
"""

_STATS_FIXED = """def mean(xs):
    return sum(xs) / len(xs)


def median(xs):
    xs = sorted(xs)
    n = len(xs)
    if n % 2:
        return xs[n // 2]
    return (xs[n // 2 - 1] + xs[n // 2]) / 2
"""

_STRINGS_FIXED = """def shout(s):
    return s.upper() + '!'


def is_palindrome(s):
    t = s.replace(" ", "").lower()
    return t == t[::-1]
"""

_STRINGS_TESTS = """from strings import is_palindrome


def test_is_palindrome():
    assert is_palindrome("Abba")
    assert not is_palindrome("ab")
"""

_GREET_FIXED = """import argparse


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("name")
    parser.add_argument("--upper", action="store_true")
    args = parser.parse_args()
    text = f"Hello, {args.name}!"
    print(text.upper() if args.upper else text)


if __name__ == "__main__":
    main()
"""

TASKS: tuple[EvalTask, ...] = (
    # ---- the headline ten -------------------------------------------------------------------
    EvalTask(
        id="squares",
        kind="script",
        prompt="Write a Python script squares.py that prints the squares of 1 to 10, one number "
        "per line, and run it.",
        check='test "$(python squares.py)" = "$(seq 1 10 | awk \'{print $1*$1}\')"',
        solution_files={"squares.py": "for i in range(1, 11):\n    print(i * i)\n"},
        solution="python squares.py",
    ),
    EvalTask(
        id="fib",
        kind="script",
        prompt="Write fib.py that prints the 20th Fibonacci number (fib(1) = fib(2) = 1) and "
        "nothing else, then run it and tell me the number.",
        check='test "$(python fib.py | tr -d "[:space:]")" = 6765 && grep -q 6765 '
        "/check/final_message.txt",
        solution_files={
            "fib.py": "a, b = 1, 1\nfor _ in range(18):\n    a, b = b, a + b\nprint(b)\n"
        },
        solution="python fib.py",
        answer="The 20th Fibonacci number is 6765.",
    ),
    EvalTask(
        id="fix-calc",
        kind="bugfix",
        prompt="The tests of this project fail. Fix the bug in calc.py so that "
        "`python -m pytest -q` passes.",
        files={
            "calc.py": "def add(a, b):\n    return a - b\n\n\ndef mul(a, b):\n    return a * b\n",
            "test_calc.py": _CALC_TEST,
        },
        check_files={"test_calc.py": _CALC_TEST},
        check="PYTHONPATH=/workspace python -m pytest -q -p no:cacheprovider /check/test_calc.py",
        solution="sed -i 's/a - b/a + b/' calc.py && python -m pytest -q",
    ),
    EvalTask(
        id="unittest-slugify",
        kind="tests",
        prompt="Write unit tests for slugify() of textutil.py in test_textutil.py using the "
        "unittest module, and run them with `python -m unittest`.",
        files={"textutil.py": _TEXTUTIL},
        check_files={"textutil_broken.py": "def slugify(text):\n    return text\n"},
        # The tests run and pass on the real slugify, and fail on a broken one.
        check="python -m unittest test_textutil 2>&1 | tee /tmp/out | tail -3; "
        'grep -Eq "^Ran [1-9]" /tmp/out && grep -q "^OK" /tmp/out && '
        "cp /check/textutil_broken.py textutil.py && ! python -m unittest test_textutil "
        ">/dev/null 2>&1",
        solution_files={"test_textutil.py": _SLUGIFY_TESTS},
        solution="python -m unittest",
    ),
    EvalTask(
        id="three-lines",
        kind="edit",
        prompt="Create notes.txt holding exactly three lines: alpha, beta and gamma. Then tell "
        "me how many lines `wc -l notes.txt` counts.",
        check="printf 'alpha\\nbeta\\ngamma\\n' | cmp - notes.txt && grep -q 3 "
        "/check/final_message.txt",
        solution="printf 'alpha\\nbeta\\ngamma\\n' > notes.txt && wc -l notes.txt",
        answer="notes.txt has 3 lines.",
    ),
    EvalTask(
        id="edit-port",
        kind="edit",
        prompt="In config.ini, change the port from 8080 to 9090. Leave everything else in the "
        "file as it is.",
        files={"config.ini": "[server]\nhost = 0.0.0.0\nport = 8080\n\n[log]\nlevel = info\n"},
        check_files={
            "expected.ini": "[server]\nhost = 0.0.0.0\nport = 9090\n\n[log]\nlevel = info\n"
        },
        check="diff /check/expected.ini config.ini",
        solution="sed -i 's/^port = 8080$/port = 9090/' config.ini",
    ),
    EvalTask(
        id="count-log-lines",
        kind="shell",
        prompt="How many lines do the .log files under logs/ hold in total? Write just that "
        "number to count.txt.",
        files={
            "logs/a.log": "start\nwork\nstop\n",
            "logs/b.log": "one\ntwo\n",
            "logs/old/c.log": "x\ny\nz\nw\n",
            "logs/readme.txt": "not a log\nat all\n",
        },
        check='test "$(tr -d "[:space:]" < count.txt)" = 9',
        solution="find logs -name '*.log' -exec cat {} + | wc -l > count.txt",
    ),
    EvalTask(
        id="csv-total",
        kind="script",
        prompt="Write total.py that prints the sum of the amount column of sales.csv, then run it.",
        files={
            "sales.csv": "date,item,amount\n2024-01-02,pen,3\n2024-01-03,book,12\n"
            "2024-01-05,lamp,25\n2024-01-09,pen,3\n"
        },
        check='python total.py | grep -Eqx "43(\\.0+)?"',
        solution_files={
            "total.py": 'import csv\n\nrows = csv.DictReader(open("sales.csv"))\n'
            'print(sum(int(r["amount"]) for r in rows))\n'
        },
        solution="python total.py",
    ),
    EvalTask(
        id="rename-function",
        kind="multi-file",
        prompt="Rename the function sq_area to square_area in every file of this project, and "
        "check that `python main.py` still prints 9.",
        files={"shapes.py": _SHAPES, "main.py": _MAIN},
        check='! grep -rq sq_area --include=*.py . && test "$(python main.py)" = 9 && '
        'python -c "from shapes import square_area; assert square_area(4) == 16"',
        solution="sed -i 's/sq_area/square_area/g' shapes.py main.py && python main.py",
    ),
    EvalTask(
        id="json-names",
        kind="shell",
        prompt="users.json lists users. Write the names of the users older than 30 to "
        "names.txt, one per line, sorted alphabetically.",
        files={
            "users.json": '[{"name": "zoe", "age": 41}, {"name": "adam", "age": 25}, '
            '{"name": "mia", "age": 31}, {"name": "bob", "age": 30}, '
            '{"name": "eve", "age": 55}]\n'
        },
        check="printf 'eve\\nmia\\nzoe\\n' | diff - names.txt",
        solution="jq -r '.[] | select(.age > 30) | .name' users.json | sort > names.txt",
    ),
    # ---- the rest --------------------------------------------------------------------------
    EvalTask(
        id="fix-stats",
        kind="bugfix",
        prompt="stats.py has a bug: its tests in test_stats.py fail. Fix stats.py so they pass.",
        files={
            "stats.py": "def mean(xs):\n    return sum(xs) / len(xs)\n\n\n"
            "def median(xs):\n    xs = sorted(xs)\n    return xs[len(xs) // 2]\n",
            "test_stats.py": _STATS_TEST,
        },
        check_files={"test_stats.py": _STATS_TEST},
        check="PYTHONPATH=/workspace python -m pytest -q -p no:cacheprovider /check/test_stats.py",
        solution_files={"stats.py": _STATS_FIXED},
        solution="python -m pytest -q",
    ),
    EvalTask(
        id="palindrome-tests",
        kind="tests",
        prompt="Add a function is_palindrome(s) to strings.py that ignores case and spaces, add "
        "pytest tests for it in test_strings.py, and run them.",
        files={"strings.py": "def shout(s):\n    return s.upper() + '!'\n"},
        check_files={"test_palindrome.py": _PALINDROME_TEST},
        check="PYTHONPATH=/workspace python -m pytest -q -p no:cacheprovider "
        "/check/test_palindrome.py && python -m pytest -q -p no:cacheprovider test_strings.py",
        solution_files={"strings.py": _STRINGS_FIXED, "test_strings.py": _STRINGS_TESTS},
        solution="python -m pytest -q",
    ),
    EvalTask(
        id="fix-syntax",
        kind="bugfix",
        prompt="`python report.py` fails. Fix it so it prints the best score.",
        files={
            "report.py": _REPORT_PY,
            "scores.json": '[{"name": "ann", "score": 7}, {"name": "li", "score": 9}]\n',
        },
        check='test "$(python report.py)" = "best: li 9"',
        solution='sed -i \'s/s\\["score"\\]$/s["score"])/\' report.py && python report.py',
    ),
    EvalTask(
        id="greet-upper",
        kind="edit",
        prompt="Add an --upper option to greet.py: with it, the greeting is printed in capital "
        "letters (`python greet.py --upper bob` prints HELLO, BOB!). Without it nothing changes.",
        files={"greet.py": _GREET_PY},
        check='test "$(python greet.py --upper bob)" = "HELLO, BOB!" && '
        'test "$(python greet.py bob)" = "Hello, bob!"',
        solution_files={"greet.py": _GREET_FIXED},
        solution="python greet.py --upper bob",
    ),
    EvalTask(
        id="primes",
        kind="script",
        prompt="Write primes.py that prints the prime numbers below 50 on one line, separated by "
        "single spaces, and run it.",
        check='test "$(python primes.py)" = "2 3 5 7 11 13 17 19 23 29 31 37 41 43 47"',
        solution_files={
            "primes.py": "ps = [n for n in range(2, 50) if all(n % d for d in range(2, n))]\n"
            'print(" ".join(map(str, ps)))\n'
        },
        solution="python primes.py",
    ),
    EvalTask(
        id="unique-emails",
        kind="shell",
        prompt="emails.txt has duplicate lines. Write its distinct lines, sorted, to unique.txt.",
        files={"emails.txt": "b@x.org\na@x.org\nc@x.org\na@x.org\nb@x.org\n"},
        check="printf 'a@x.org\\nb@x.org\\nc@x.org\\n' | diff - unique.txt",
        solution="sort -u emails.txt > unique.txt",
    ),
    EvalTask(
        id="backup-py",
        kind="shell",
        prompt="Create a directory backup/ holding a copy of every .py file at the top of this "
        "project (not the .txt files).",
        files={"a.py": "print('a')\n", "b.py": "print('b')\n", "notes.txt": "keep\n"},
        check="cmp a.py backup/a.py && cmp b.py backup/b.py && test ! -e backup/notes.txt",
        solution="mkdir -p backup && cp *.py backup/",
    ),
    EvalTask(
        id="replace-name",
        kind="multi-file",
        prompt='Replace "Acme Corp" with "Acme Inc" in every file under docs/.',
        files={
            "docs/index.md": "# Acme Corp\nWelcome to Acme Corp.\n",
            "docs/about/team.md": "Acme Corp has 3 people.\n",
            "docs/legal.txt": "(c) Acme Corp\n",
        },
        check='! grep -rq "Acme Corp" docs && test "$(grep -rho "Acme Inc" docs | wc -l)" = 4',
        solution="grep -rl 'Acme Corp' docs | xargs sed -i 's/Acme Corp/Acme Inc/g'",
    ),
    EvalTask(
        id="git-commit",
        kind="shell",
        prompt="Create a file VERSION containing 1.2.0 and commit it with git, with the commit "
        "message 'release 1.2.0'.",
        files={"README.md": "# tool\n"},
        check='test "$(git log -1 --format=%s)" = "release 1.2.0" && '
        'test "$(git show HEAD:VERSION | tr -d "[:space:]")" = 1.2.0',
        solution="echo 1.2.0 > VERSION && git add VERSION && "
        "git -c user.name=a -c user.email=a@b commit -qm 'release 1.2.0'",
    ),
    EvalTask(
        id="apply-patch",
        kind="edit",
        prompt="Apply fix.patch to this project.",
        files={"version.py": 'VERSION = "1.0.0"\nNAME = "tool"\n', "fix.patch": _PATCH},
        check='printf \'VERSION = "1.1.0"\\nNAME = "tool"\\n\' | diff - version.py',
        solution="patch -p1 < fix.patch",
    ),
    EvalTask(
        id="csv-to-json",
        kind="script",
        prompt="Convert people.csv to people.json: a JSON list with one object per row, keys "
        "from the header, age as a number.",
        files={"people.csv": "name,age\nann,31\nbo,5\n"},
        check="python -c \"import json; d = json.load(open('people.json')); "
        "assert d == [{'name': 'ann', 'age': 31}, {'name': 'bo', 'age': 5}], d\"",
        solution_files={
            "to_json.py": "import csv\nimport json\n\n"
            'rows = [{"name": r["name"], "age": int(r["age"])} '
            'for r in csv.DictReader(open("people.csv"))]\n'
            'json.dump(rows, open("people.json", "w"))\n'
        },
        solution="python to_json.py",
    ),
    EvalTask(
        id="makefile-test",
        kind="multi-file",
        prompt="Write a Makefile whose `test` target runs this project's tests with "
        "`python -m pytest -q`, and run `make test`.",
        files={
            "calc.py": "def add(a, b):\n    return a + b\n",
            "test_calc.py": "from calc import add\n\n\n"
            "def test_add():\n    assert add(1, 2) == 3\n",
        },
        check="make -n test | grep -q pytest && make test",
        solution="printf 'test:\\n\\tpython -m pytest -q\\n' > Makefile && make test",
    ),
)

HEADLINE: tuple[str, ...] = (
    "squares",
    "fib",
    "fix-calc",
    "unittest-slugify",
    "three-lines",
    "edit-port",
    "count-log-lines",
    "csv-total",
    "rename-function",
    "json-names",
)


def select(subset: str, only: list[str] | None = None) -> list[EvalTask]:
    """The tasks of `subset` ("headline" or "all"), or those named in `only` (ValueError names
    an unknown one)."""
    by_id = {task.id: task for task in TASKS}
    if only:
        unknown = [name for name in only if name not in by_id]
        if unknown:
            raise ValueError(f"unknown task(s) {unknown}; known: {sorted(by_id)}")
        return [by_id[name] for name in only]
    if subset == "headline":
        return [by_id[name] for name in HEADLINE]
    if subset == "all":
        return list(TASKS)
    raise ValueError(f"subset {subset!r}: use 'headline' or 'all'")
