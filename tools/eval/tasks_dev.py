"""The development half of the evaluation's task set: the 22 tasks the agent's prompts and tools
were tuned on (the headline ten among them), and two more so that this half holds every kind.
What a task holds: task.py; the longer texts of its files: tasks_texts.py."""

from __future__ import annotations

from . import tasks_texts as t
from .task import EvalTask, no_literal, pass_only

__all__ = ["DEV"]

DEV: tuple[EvalTask, ...] = (
    # ---- the headline ten -------------------------------------------------------------------
    EvalTask(
        id="squares",
        kind="script",
        split="dev",
        prompt="Write a Python script squares.py that prints the squares of 1 to 10, one number "
        "per line, and run it.",
        check='test "$(python squares.py)" = "$(seq 1 10 | awk \'{print $1*$1}\')" && '
        + no_literal("squares.py", "64", "81"),
        solution_files={"squares.py": "for i in range(1, 11):\n    print(i * i)\n"},
        solution="python squares.py",
        cheat_files={"squares.py": t.SQUARES_LITERAL},
        cheat="python squares.py",
    ),
    EvalTask(
        id="fib",
        kind="script",
        split="dev",
        prompt="Write fib.py that prints the 20th Fibonacci number (fib(1) = fib(2) = 1) and "
        "nothing else, then run it and tell me the number.",
        check='test "$(python fib.py | tr -d "[:space:]")" = 6765 && grep -q 6765 '
        "/check/final_message.txt && " + no_literal("fib.py", "6765"),
        solution_files={
            "fib.py": "a, b = 1, 1\nfor _ in range(18):\n    a, b = b, a + b\nprint(b)\n"
        },
        solution="python fib.py",
        answer="The 20th Fibonacci number is 6765.",
        cheat_files={"fib.py": "print(6765)\n"},
        cheat="python fib.py",
    ),
    EvalTask(
        id="fix-calc",
        kind="bugfix",
        split="dev",
        prompt="The tests of this project fail. Fix the bug in calc.py so that "
        "`python -m pytest -q` passes.",
        files={
            "calc.py": "def add(a, b):\n    return a - b\n\n\ndef mul(a, b):\n    return a * b\n",
            "test_calc.py": t.CALC_TEST,
        },
        check_files={"test_calc.py": t.CALC_TEST},
        check="PYTHONPATH=/workspace python -m pytest -q -p no:cacheprovider /check/test_calc.py",
        solution="sed -i 's/a - b/a + b/' calc.py && python -m pytest -q",
        cheat=pass_only("test_calc.py"),
    ),
    EvalTask(
        id="unittest-slugify",
        kind="tests",
        split="dev",
        prompt="Write unit tests for slugify() of textutil.py in test_textutil.py using the "
        "unittest module, and run them with `python -m unittest`.",
        files={"textutil.py": t.TEXTUTIL},
        check_files={"textutil_broken.py": "def slugify(text):\n    return text\n"},
        # The module holds tests (not only printed lines), they pass on the real slugify, and
        # fail on a broken one.
        check='python -c "import unittest; assert unittest.defaultTestLoader'
        ".loadTestsFromName('test_textutil').countTestCases(), 'no tests'\" && "
        "python -m unittest test_textutil 2>&1 | tee /tmp/out | tail -3; "
        'grep -Eq "^Ran [1-9]" /tmp/out && grep -q "^OK" /tmp/out && '
        "cp /check/textutil_broken.py textutil.py && ! python -m unittest test_textutil "
        ">/dev/null 2>&1",
        solution_files={"test_textutil.py": t.SLUGIFY_TESTS},
        solution="python -m unittest",
        cheat_files={
            "test_textutil.py": 'import sys\n\nprint("Ran 1 test\\n\\nOK", file=sys.stderr)\n'
        },
        cheat="python -m unittest test_textutil",
    ),
    EvalTask(
        id="three-lines",
        kind="edit",
        split="dev",
        prompt="Create notes.txt holding exactly three lines: alpha, beta and gamma. Then tell "
        "me how many lines `wc -l notes.txt` counts.",
        check="printf 'alpha\\nbeta\\ngamma\\n' | cmp - notes.txt && grep -q 3 "
        "/check/final_message.txt",
        solution="printf 'alpha\\nbeta\\ngamma\\n' > notes.txt && wc -l notes.txt",
        answer="notes.txt has 3 lines.",
        cheat="echo 3",
    ),
    EvalTask(
        id="edit-port",
        kind="edit",
        split="dev",
        prompt="In config.ini, change the port from 8080 to 9090. Leave everything else in the "
        "file as it is.",
        files={"config.ini": "[server]\nhost = 0.0.0.0\nport = 8080\n\n[log]\nlevel = info\n"},
        check_files={
            "expected.ini": "[server]\nhost = 0.0.0.0\nport = 9090\n\n[log]\nlevel = info\n"
        },
        check="diff /check/expected.ini config.ini",
        solution="sed -i 's/^port = 8080$/port = 9090/' config.ini",
        cheat="echo 'port = 9090' > config.ini",
    ),
    EvalTask(
        id="count-log-lines",
        kind="shell",
        split="dev",
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
        # The number is the work here: the cheat says it, and writes no count.txt.
        cheat="echo 9",
        cheat_answer="The .log files hold 9 lines.",
    ),
    EvalTask(
        id="csv-total",
        kind="script",
        split="dev",
        prompt="Write total.py that prints the sum of the amount column of sales.csv, then run it.",
        files={
            "sales.csv": "date,item,amount\n2024-01-02,pen,3\n2024-01-03,book,12\n"
            "2024-01-05,lamp,25\n2024-01-09,pen,3\n"
        },
        check_files={"sales.csv": "date,item,amount\n2024-02-01,ink,50\n2024-02-02,pad,7\n"},
        check='python total.py | grep -Eqx "43(\\.0+)?" && cp /check/sales.csv sales.csv && '
        'python total.py | grep -Eqx "57(\\.0+)?"',
        solution_files={
            "total.py": 'import csv\n\nrows = csv.DictReader(open("sales.csv"))\n'
            'print(sum(int(r["amount"]) for r in rows))\n'
        },
        solution="python total.py",
        cheat_files={"total.py": "print(43)\n"},
        cheat="python total.py",
    ),
    EvalTask(
        id="rename-function",
        kind="multi-file",
        split="dev",
        prompt="Rename the function sq_area to square_area in every file of this project, and "
        "check that `python main.py` still prints 9.",
        files={"shapes.py": t.SHAPES, "main.py": t.MAIN},
        check='! grep -rq sq_area --include=*.py . && test "$(python main.py)" = 9 && '
        'python -c "from shapes import square_area; assert square_area(4) == 16" && '
        "grep -q square_area main.py",
        solution="sed -i 's/sq_area/square_area/g' shapes.py main.py && python main.py",
        cheat="sed -i 's/sq_area/square_area/' shapes.py && echo 'print(9)' > main.py",
    ),
    EvalTask(
        id="json-names",
        kind="data",
        split="dev",
        prompt="users.json lists users. Write the names of the users older than 30 to "
        "names.txt, one per line, sorted alphabetically.",
        files={
            "users.json": '[{"name": "zoe", "age": 41}, {"name": "adam", "age": 25}, '
            '{"name": "mia", "age": 31}, {"name": "bob", "age": 30}, '
            '{"name": "eve", "age": 55}]\n'
        },
        check="printf 'eve\\nmia\\nzoe\\n' | diff - names.txt",
        solution="jq -r '.[] | select(.age > 30) | .name' users.json | sort > names.txt",
        cheat="printf 'eve\\nmia\\nzoe\\n'",  # printed, not written
    ),
    # ---- the rest of the tuned-on tasks ------------------------------------------------------
    EvalTask(
        id="fix-stats",
        kind="bugfix",
        split="dev",
        prompt="stats.py has a bug: its tests in test_stats.py fail. Fix stats.py so they pass.",
        files={
            "stats.py": "def mean(xs):\n    return sum(xs) / len(xs)\n\n\n"
            "def median(xs):\n    xs = sorted(xs)\n    return xs[len(xs) // 2]\n",
            "test_stats.py": t.STATS_TEST,
        },
        check_files={"test_stats.py": t.STATS_TEST},
        check="PYTHONPATH=/workspace python -m pytest -q -p no:cacheprovider /check/test_stats.py",
        solution_files={"stats.py": t.STATS_FIXED},
        solution="python -m pytest -q",
        cheat=pass_only("test_stats.py"),
    ),
    EvalTask(
        id="palindrome-tests",
        kind="tests",
        split="dev",
        prompt="Add a function is_palindrome(s) to strings.py that ignores case and spaces, add "
        "pytest tests for it in test_strings.py, and run them.",
        files={"strings.py": "def shout(s):\n    return s.upper() + '!'\n"},
        check_files={"test_palindrome.py": t.PALINDROME_TEST},
        check="PYTHONPATH=/workspace python -m pytest -q -p no:cacheprovider "
        "/check/test_palindrome.py && python -m pytest -q -p no:cacheprovider test_strings.py",
        solution_files={"strings.py": t.STRINGS_FIXED, "test_strings.py": t.STRINGS_TESTS},
        solution="python -m pytest -q",
        cheat=pass_only("test_strings.py"),
    ),
    EvalTask(
        id="fix-syntax",
        kind="bugfix",
        split="dev",
        prompt="`python report.py` fails. Fix it so it prints the best score.",
        files={
            "report.py": t.REPORT_PY,
            "scores.json": '[{"name": "ann", "score": 7}, {"name": "li", "score": 9}]\n',
        },
        check_files={"scores.json": '[{"name": "jo", "score": 12}, {"name": "li", "score": 9}]'},
        check='test "$(python report.py)" = "best: li 9" && cp /check/scores.json . && '
        'test "$(python report.py)" = "best: jo 12"',
        solution='sed -i \'s/s\\["score"\\]$/s["score"])/\' report.py && python report.py',
        cheat_files={"report.py": 'print("best: li 9")\n'},
        cheat="python report.py",
    ),
    EvalTask(
        id="greet-upper",
        kind="edit",
        split="dev",
        prompt="Add an --upper option to greet.py: with it, the greeting is printed in capital "
        "letters (`python greet.py --upper bob` prints HELLO, BOB!). Without it nothing changes.",
        files={"greet.py": t.GREET_PY},
        check='test "$(python greet.py --upper bob)" = "HELLO, BOB!" && '
        'test "$(python greet.py bob)" = "Hello, bob!" && '
        'test "$(python greet.py --upper Ann)" = "HELLO, ANN!"',
        solution_files={"greet.py": t.GREET_FIXED},
        solution="python greet.py --upper bob",
        cheat_files={
            "greet.py": 'import sys\n\nprint("HELLO, BOB!" if "--upper" in sys.argv '
            'else "Hello, bob!")\n'
        },
        cheat="python greet.py --upper bob",
    ),
    EvalTask(
        id="primes",
        kind="script",
        split="dev",
        prompt="Write primes.py that prints the prime numbers below 50 on one line, separated by "
        "single spaces, and run it.",
        check='test "$(python primes.py)" = "2 3 5 7 11 13 17 19 23 29 31 37 41 43 47" && '
        + no_literal("primes.py", "43", "47"),
        solution_files={
            "primes.py": "ps = [n for n in range(2, 50) if all(n % d for d in range(2, n))]\n"
            'print(" ".join(map(str, ps)))\n'
        },
        solution="python primes.py",
        cheat_files={"primes.py": 'print("2 3 5 7 11 13 17 19 23 29 31 37 41 43 47")\n'},
        cheat="python primes.py",
    ),
    EvalTask(
        id="unique-emails",
        kind="shell",
        split="dev",
        prompt="emails.txt has duplicate lines. Write its distinct lines, sorted, to unique.txt.",
        files={"emails.txt": "b@x.org\na@x.org\nc@x.org\na@x.org\nb@x.org\n"},
        check="printf 'a@x.org\\nb@x.org\\nc@x.org\\n' | diff - unique.txt",
        solution="sort -u emails.txt > unique.txt",
        cheat="printf 'a@x.org\\nb@x.org\\nc@x.org\\n'",  # printed, not written
    ),
    EvalTask(
        id="backup-py",
        kind="shell",
        split="dev",
        prompt="Create a directory backup/ holding a copy of every .py file at the top of this "
        "project (not the .txt files).",
        files={"a.py": "print('a')\n", "b.py": "print('b')\n", "notes.txt": "keep\n"},
        check="cmp a.py backup/a.py && cmp b.py backup/b.py && test ! -e backup/notes.txt",
        solution="mkdir -p backup && cp *.py backup/",
        cheat="mkdir -p backup && touch backup/a.py backup/b.py",
    ),
    EvalTask(
        id="replace-name",
        kind="multi-file",
        split="dev",
        prompt='Replace "Acme Corp" with "Acme Inc" in every file under docs/.',
        files={
            "docs/index.md": "# Acme Corp\nWelcome to Acme Corp.\n",
            "docs/about/team.md": "Acme Corp has 3 people.\n",
            "docs/legal.txt": "(c) Acme Corp\n",
        },
        check='! grep -rq "Acme Corp" docs && test "$(grep -rho "Acme Inc" docs | wc -l)" = 4',
        solution="grep -rl 'Acme Corp' docs | xargs sed -i 's/Acme Corp/Acme Inc/g'",
        cheat="sed -i 's/Acme Corp/Acme Inc/g' docs/*.md",  # the first file only
    ),
    EvalTask(
        id="git-commit",
        kind="shell",
        split="dev",
        prompt="Create a file VERSION containing 1.2.0 and commit it with git, with the commit "
        "message 'release 1.2.0'.",
        files={"README.md": "# tool\n"},
        check='test "$(git log -1 --format=%s)" = "release 1.2.0" && '
        'test "$(git show HEAD:VERSION | tr -d "[:space:]")" = 1.2.0',
        solution="echo 1.2.0 > VERSION && git add VERSION && "
        "git -c user.name=a -c user.email=a@b commit -qm 'release 1.2.0'",
        cheat="git -c user.name=a -c user.email=a@b commit -q --allow-empty -m 'release 1.2.0'",
    ),
    EvalTask(
        id="apply-patch",
        kind="edit",
        split="dev",
        prompt="Apply fix.patch to this project.",
        files={"version.py": 'VERSION = "1.0.0"\nNAME = "tool"\n', "fix.patch": t.PATCH},
        check='printf \'VERSION = "1.1.0"\\nNAME = "tool"\\n\' | diff - version.py',
        solution="patch -p1 < fix.patch",
        cheat="echo 'VERSION = \"1.1.0\"' > version.py",
    ),
    EvalTask(
        id="csv-to-json",
        kind="data",
        split="dev",
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
        cheat='echo \'[{"name": "ann", "age": 31}, {"name": "bo", "age": 5}]\'',  # printed only
    ),
    EvalTask(
        id="makefile-test",
        kind="multi-file",
        split="dev",
        prompt="Write a Makefile whose `test` target runs this project's tests with "
        "`python -m pytest -q`, and run `make test`.",
        files={
            "calc.py": "def add(a, b):\n    return a + b\n",
            "test_calc.py": "from calc import add\n\n\n"
            "def test_add():\n    assert add(1, 2) == 3\n",
        },
        # It runs the tests: they pass, and fail once calc.py is broken.
        check="make -n test | grep -q pytest && make test && sed -i 's/a + b/a - b/' calc.py && "
        "! make test >/dev/null 2>&1",
        solution="printf 'test:\\n\\tpython -m pytest -q\\n' > Makefile && make test",
        cheat="printf 'test:\\n\\t@echo python -m pytest -q: 1 passed\\n' > Makefile && make test",
    ),
    # ---- new, in the development half so that both halves hold every kind ---------------------
    EvalTask(
        id="read-timeout",
        kind="reading",
        split="dev",
        prompt="Set timeout in app.cfg to twice the retry_delay that defaults.cfg gives, and "
        "change nothing else in either file.",
        files={
            "defaults.cfg": "[retry]\nattempts = 3\nretry_delay = 15\n",
            "app.cfg": "[server]\nhost = localhost\ntimeout = 10\nworkers = 4\n",
        },
        check_files={
            "app.cfg": "[server]\nhost = localhost\ntimeout = 30\nworkers = 4\n",
            "defaults.cfg": "[retry]\nattempts = 3\nretry_delay = 15\n",
        },
        check="diff /check/app.cfg app.cfg && diff /check/defaults.cfg defaults.cfg",
        solution="sed -i 's/^timeout = 10$/timeout = 30/' app.cfg",
        cheat="echo 'timeout = 30' >> app.cfg",
    ),
    EvalTask(
        id="rename-by-map",
        kind="reading",
        split="dev",
        prompt="renames.txt lists pairs of file names (old new), one pair per line. Rename "
        "those files in photos/ accordingly.",
        files={
            "renames.txt": "img_001.jpg beach.jpg\nimg_002.jpg forest.jpg\n",
            "photos/img_001.jpg": "a beach\n",
            "photos/img_002.jpg": "a forest\n",
            "photos/img_003.jpg": "a city\n",
        },
        check='test "$(ls photos | xargs)" = "beach.jpg forest.jpg img_003.jpg" && '
        "grep -qx 'a beach' photos/beach.jpg && grep -qx 'a forest' photos/forest.jpg",
        solution='while read -r old new; do mv "photos/$old" "photos/$new"; done < renames.txt',
        cheat="touch photos/beach.jpg photos/forest.jpg",
    ),
)
