"""The held-out half of the evaluation's task set: tasks the agent's prompts and tools are not
tuned on, so that their pass rate says how the agent does on work nobody shaped it for. Do not
tune on them: a change is judged on the development half (tasks_dev.py), then measured here.

Each check verifies the work, not a printed line: a program is run again on other input from
/check, hidden tests replace the agent's own, the files are compared. What each holds: task.py.
"""

from __future__ import annotations

from . import tasks_texts as t
from .task import EvalTask, hidden_tests, lines, pass_only

__all__ = ["HELDOUT"]

HELDOUT: tuple[EvalTask, ...] = (
    EvalTask(
        id="fizzbuzz",
        kind="script",
        split="heldout",
        prompt="Write fizzbuzz.py that takes a number N as its argument and prints FizzBuzz from "
        "1 to N, one item per line (Fizz for multiples of 3, Buzz of 5, FizzBuzz of both), and "
        "run it with 15.",
        check=t.FIZZ_REF + "python fizzbuzz.py 15 | diff <(fb 15) - && "
        "python fizzbuzz.py 31 | diff <(fb 31) -",
        solution_files={"fizzbuzz.py": t.FIZZ},
        solution="python fizzbuzz.py 15",
        cheat_files={"fizzbuzz.py": t.FIZZ_CHEAT},
        cheat="python fizzbuzz.py 15",
    ),
    EvalTask(
        id="celsius",
        kind="script",
        split="heldout",
        prompt="Write convert.py that takes a temperature in Celsius as its argument and prints "
        "it in Fahrenheit with one decimal (`python convert.py 100` prints 212.0). Run it for 37 "
        "and tell me the result.",
        check='test "$(python convert.py 37)" = 98.6 && test "$(python convert.py -40)" = -40.0 '
        '&& test "$(python convert.py 21.5)" = 70.7 && grep -q 98.6 /check/final_message.txt',
        solution_files={
            "convert.py": 'import sys\n\nprint(f"{float(sys.argv[1]) * 9 / 5 + 32:.1f}")\n'
        },
        solution="python convert.py 37",
        answer="37 °C is 98.6 °F.",
        cheat_files={"convert.py": "print(98.6)\n"},
        cheat="python convert.py 37",
    ),
    EvalTask(
        id="word-freq",
        kind="script",
        split="heldout",
        prompt="Write wordfreq.py that prints the three most frequent words of text.txt (words "
        "are separated by spaces and newlines) with their counts, as `word count` lines, most "
        "frequent first, and run it.",
        files={"text.txt": "the dog saw the cat\nthe dog ran\nthe dog saw a bird\n"},
        check_files={"text.txt": "a b c a b a d\nc a b e\n"},
        check=f'test "$(python wordfreq.py)" = {lines("the 4", "dog 3", "saw 2")} && '
        f'cp /check/text.txt . && test "$(python wordfreq.py)" = {lines("a 4", "b 3", "c 2")}',
        solution_files={
            "wordfreq.py": "from collections import Counter\n\n"
            'for word, n in Counter(open("text.txt").read().split()).most_common(3):\n'
            "    print(word, n)\n"
        },
        solution="python wordfreq.py",
        cheat_files={"wordfreq.py": 'print("the 4\\ndog 3\\nsaw 2")\n'},
        cheat="python wordfreq.py",
    ),
    EvalTask(
        id="fix-pages",
        kind="bugfix",
        split="heldout",
        prompt="`python -m pytest -q` fails in this project. Fix the bug in paginate.py.",
        files={"paginate.py": t.PAGES, "test_paginate.py": t.PAGES_TEST},
        check_files={"test_paginate.py": t.PAGES_HIDDEN},
        check=hidden_tests("test_paginate.py"),
        solution="sed -i 's/len(items) - size/len(items)/' paginate.py && python -m pytest -q",
        cheat=pass_only("test_paginate.py"),
    ),
    EvalTask(
        id="fix-sum",
        kind="bugfix",
        split="heldout",
        prompt="`python total.py numbers.txt` should print the sum of the numbers in numbers.txt "
        "(one per line) but prints a wrong number. Fix total.py.",
        files={
            "total.py": "import sys\n\nwith open(sys.argv[1]) as f:\n    lines = f.read()"
            ".splitlines()\nprint(sum(int(line) for line in lines[1:]))\n",
            "numbers.txt": "5\n10\n20\n",
        },
        check_files={"more.txt": "7\n1\n2\n"},
        check='test "$(python total.py numbers.txt)" = 35 && '
        'test "$(python total.py /check/more.txt)" = 10',
        solution="sed -i 's/lines\\[1:\\]/lines/' total.py && python total.py numbers.txt",
        cheat_files={"total.py": "print(35)\n"},
        cheat="python total.py numbers.txt",
    ),
    EvalTask(
        id="fix-config-key",
        kind="bugfix",
        split="heldout",
        prompt="`python hello.py` crashes. Fix hello.py, leaving config.json as it is, so that "
        "it greets the user config.json names.",
        files={
            "config.json": '{"user": "ada", "greeting": "Hello"}\n',
            "hello.py": 'import json\n\nconfig = json.load(open("config.json"))\n'
            "print(f\"{config['greeting']}, {config['username']}!\")\n",
        },
        check_files={
            "config.json": '{"user": "ada", "greeting": "Hello"}\n',
            "other.json": '{"user": "lin", "greeting": "Hi"}\n',
        },
        check='test "$(python hello.py)" = "Hello, ada!" && diff /check/config.json config.json '
        '&& cp /check/other.json config.json && test "$(python hello.py)" = "Hi, lin!"',
        solution="sed -i \"s/'username'/'user'/\" hello.py && python hello.py",
        cheat_files={"hello.py": 'print("Hello, ada!")\n'},
        cheat="python hello.py",
    ),
    EvalTask(
        id="inventory-tests",
        kind="tests",
        split="heldout",
        prompt="Make the tests in test_inventory.py pass: add the methods they use to the "
        "Inventory class of inventory.py, without changing the tests.",
        files={"inventory.py": t.INVENTORY, "test_inventory.py": t.INVENTORY_TEST},
        check_files={"test_inventory.py": t.INVENTORY_TEST},
        check=hidden_tests("test_inventory.py"),
        solution_files={"inventory.py": t.INVENTORY_DONE},
        solution="python -m pytest -q",
        cheat=pass_only("test_inventory.py"),
    ),
    EvalTask(
        id="roman-tests",
        kind="tests",
        split="heldout",
        prompt="Write pytest tests for to_roman() of roman.py in test_roman.py, and run them.",
        files={"roman.py": t.ROMAN},
        check_files={"roman_broken.py": "def to_roman(n):\n    return 'I' * n\n"},
        # The tests pass on the real to_roman and fail on a broken one.
        check="python -m pytest -q -p no:cacheprovider test_roman.py && "
        "cp /check/roman_broken.py roman.py && "
        "! python -m pytest -q -p no:cacheprovider test_roman.py >/dev/null 2>&1",
        solution_files={
            "test_roman.py": "from roman import to_roman\n\n\ndef test_to_roman():\n"
            '    assert to_roman(14) == "XIV"\n    assert to_roman(1994) == "MCMXCIV"\n'
        },
        solution="python -m pytest -q",
        cheat=pass_only("test_roman.py"),
    ),
    EvalTask(
        id="leap-doctest",
        kind="tests",
        split="heldout",
        prompt="`python -m doctest dates.py` reports failures. Fix is_leap() in dates.py so that "
        "its examples pass; do not change the examples.",
        files={"dates.py": t.LEAP},
        check_files={"test_dates.py": t.LEAP_TEST},
        check=hidden_tests("test_dates.py") + " && python -m doctest dates.py && "
        "test \"$(grep -c '>>> is_leap' dates.py)\" = 3",
        solution="sed -i 's/return year % 4 == 0$/return year % 4 == 0 and "
        "(year % 100 != 0 or year % 400 == 0)/' dates.py && python -m doctest -v dates.py",
        cheat="sed -i '/>>>/,+1d' dates.py && python -m doctest dates.py",  # examples removed
    ),
    EvalTask(
        id="package-script",
        kind="edit",
        split="heldout",
        prompt="Add a `test` script to package.json that runs `node test.js`, keeping "
        "everything else in the file as it is.",
        files={"package.json": t.PACKAGE, "test.js": 'console.log("tests ok");\n'},
        check_files={"package.json": t.PACKAGE},
        check="jq -e '.scripts.test == \"node test.js\"' package.json && "
        "jq -e --slurpfile old /check/package.json 'del(.scripts.test) == $old[0]' package.json",
        solution="jq '.scripts.test = \"node test.js\"' package.json > /tmp/p.json && "
        "cat /tmp/p.json > package.json",
        cheat='echo \'{"scripts": {"test": "node test.js"}}\' > package.json',
    ),
    EvalTask(
        id="env-edit",
        kind="edit",
        split="heldout",
        prompt="In .env, set DEBUG to false and add the line LOG_LEVEL=warn at the end; keep the "
        "other lines as they are.",
        files={".env": "APP_NAME=shop\nDEBUG=true\nPORT=8000\n"},
        check="printf 'APP_NAME=shop\\nDEBUG=false\\nPORT=8000\\nLOG_LEVEL=warn\\n' | diff - .env",
        solution="sed -i 's/^DEBUG=true$/DEBUG=false/' .env && echo LOG_LEVEL=warn >> .env",
        cheat="echo LOG_LEVEL=warn >> .env",
    ),
    EvalTask(
        id="default-greeting",
        kind="edit",
        split="heldout",
        prompt='Make "Hi" the default greeting of greet() in greet.py instead of "Hello", so '
        "that `python greet.py ann` prints Hi, ann!",
        files={"greet.py": t.GREET},
        check='test "$(python greet.py ann)" = "Hi, ann!" && test "$(python greet.py bo)" = '
        '"Hi, bo!" && python -c \'from greet import greet; assert greet("x", "Yo") == "Yo, x!"\'',
        solution='sed -i \'s/greeting="Hello"/greeting="Hi"/\' greet.py && python greet.py ann',
        cheat_files={"greet.py": 'print("Hi, ann!")\n'},
        cheat="python greet.py ann",
    ),
    EvalTask(
        id="tar-src",
        kind="shell",
        split="heldout",
        prompt="Create src.tar.gz, a gzip-compressed tar archive of the directory src/ (the "
        "paths in it starting with src/).",
        files={"src/main.py": "print('main')\n", "src/lib/util.py": "X = 1\n", "README.md": "#\n"},
        check='d=$(mktemp -d) && tar -xzf src.tar.gz -C "$d" && '
        'diff -r -x __pycache__ src "$d/src" && test ! -e "$d/README.md"',
        solution="tar -czf src.tar.gz src && tar -tzf src.tar.gz",
        cheat="touch src.tar.gz",
    ),
    EvalTask(
        id="exec-script",
        kind="shell",
        split="heldout",
        prompt="Make hello.sh runnable as `./hello.sh`: give it a bash shebang line and make it "
        "executable, then run it.",
        files={"hello.sh": 'echo "hello from hello.sh"\n'},
        check="test -x hello.sh && head -1 hello.sh | grep -Eq '^#!.*bash' && "
        'test "$(./hello.sh)" = "hello from hello.sh"',
        solution="sed -i '1i #!/bin/bash' hello.sh && chmod +x hello.sh && ./hello.sh",
        cheat='echo "hello from hello.sh"',
    ),
    EvalTask(
        id="sort-by-ext",
        kind="shell",
        split="heldout",
        prompt="Move each file of inbox/ into a directory named after its extension "
        "(inbox/a.txt goes to txt/a.txt), leaving inbox/ empty.",
        files={
            "inbox/a.txt": "note a\n",
            "inbox/b.csv": "x,y\n",
            "inbox/c.txt": "note c\n",
            "inbox/d.json": "{}\n",
        },
        check='test -z "$(ls -A inbox 2>/dev/null)" && grep -qx "note a" txt/a.txt && '
        'grep -qx "note c" txt/c.txt && grep -qx x,y csv/b.csv && grep -qx "{}" json/d.json',
        solution='for f in inbox/*; do mkdir -p "${f##*.}" && mv "$f" "${f##*.}/"; done',
        cheat="mkdir -p txt csv json && touch txt/a.txt txt/c.txt csv/b.csv json/d.json",
    ),
    EvalTask(
        id="fix-geo",
        kind="multi-file",
        split="heldout",
        prompt="The tests in tests/ fail. Fix the package geo/ (there is more than one bug) so "
        "that `python -m pytest -q` passes.",
        files={
            "geo/__init__.py": "",
            "geo/units.py": "KM_PER_MILE = 1.609344\n",
            "geo/convert.py": t.GEO_CONVERT,
            "geo/report.py": t.GEO_REPORT,
            "tests/test_geo.py": t.GEO_TEST,
        },
        check_files={"test_geo.py": t.GEO_HIDDEN},
        check=hidden_tests("test_geo.py"),
        solution="sed -i 's|miles / KM|miles * KM|' geo/convert.py && "
        "sed -i 's/:.0f}/:.1f}/' geo/report.py && python -m pytest -q",
        cheat="sed -i 's/:.0f}/:.1f}/' geo/report.py",  # half the work
    ),
    EvalTask(
        id="rename-module",
        kind="multi-file",
        split="heldout",
        prompt="Rename helpers.py to textutils.py and update every import of it, so that "
        "`python app.py` prints the same as before.",
        files={
            "helpers.py": 'def shout(text):\n    return text.upper() + "!"\n',
            "report.py": "import helpers\n\n\ndef title(text):\n    return helpers.shout(text)\n",
            "app.py": 'from helpers import shout\nfrom report import title\n\nprint(title("menu"))'
            '\nprint(shout("open"))\n',
        },
        check=f'test ! -e helpers.py && test "$(python app.py)" = {lines("MENU!", "OPEN!")} && '
        "! grep -rqw helpers --include=*.py . && "
        'python -c \'from textutils import shout; assert shout("a") == "A!"\'',
        solution="git mv helpers.py textutils.py && sed -i 's/helpers/textutils/g' app.py "
        "report.py && python app.py",
        cheat='mv helpers.py textutils.py && printf \'print("MENU!")\\nprint("OPEN!")\\n\' '
        "> app.py",
    ),
    EvalTask(
        id="tax-constant",
        kind="multi-file",
        split="heldout",
        prompt="The tax rate 0.2 is written in more than one file. Define it once, as TAX_RATE "
        "in a new file config.py, and use that everywhere, so that `python main.py` prints the "
        "same.",
        files={
            "cart.py": "def total(prices):\n    return round(sum(prices) * (1 + 0.2), 2)\n",
            "invoice.py": "from cart import total\n\n\ndef line(prices):\n"
            "    tax = round(sum(prices) * 0.2, 2)\n"
            '    return f"total {total(prices)} (tax {tax})"\n',
            "main.py": "from invoice import line\n\nprint(line([10, 5]))\n",
        },
        # The rate is used from config.py: another rate there changes the output.
        check='test "$(python main.py)" = "total 18.0 (tax 3.0)" && '
        "! grep -rq '0\\.2' --include=*.py --exclude=config.py . && "
        'echo "TAX_RATE = 0.1" > config.py && test "$(python main.py)" = "total 16.5 (tax 1.5)"',
        solution="echo 'TAX_RATE = 0.2' > config.py && sed -i 's/0\\.2/TAX_RATE/' cart.py "
        "invoice.py && sed -i '1i from config import TAX_RATE' cart.py invoice.py && "
        "python main.py",
        cheat="echo 'TAX_RATE = 0.2' > config.py && "
        "echo 'print(\"total 18.0 (tax 3.0)\")' > main.py",
    ),
    EvalTask(
        id="log-levels",
        kind="data",
        split="heldout",
        prompt="Write levels.py that counts the lines of each level (the third field) of app.log "
        "and prints `LEVEL count` lines sorted by level; run it and save its output in "
        "levels.txt.",
        files={"app.log": t.LOG},
        check_files={"app.log": t.LOG_HIDDEN},
        check=f'test "$(cat levels.txt)" = {lines("ERROR 2", "INFO 4", "WARN 1")} && '
        "cp /check/app.log . && "
        f'test "$(python levels.py)" = {lines("DEBUG 1", "INFO 2", "WARN 3")}',
        solution_files={"levels.py": t.LEVELS},
        solution="python levels.py > levels.txt",
        cheat_files={
            "levels.py": 'print("ERROR 2\\nINFO 4\\nWARN 1")\n',
            "levels.txt": "ERROR 2\nINFO 4\nWARN 1\n",
        },
        cheat="python levels.py",
    ),
    EvalTask(
        id="city-totals",
        kind="data",
        split="heldout",
        prompt="Write by_city.py that prints a `city,total` line for each city of orders.csv "
        "(the total of its amounts, whole numbers), sorted by city; run it and save its output "
        "in totals.csv.",
        files={"orders.csv": t.ORDERS},
        check_files={"orders.csv": "id,city,amount\n1,Rome,4\n2,Kyiv,7\n3,Rome,8\n"},
        # A header line is allowed.
        check="rows() { grep -v '^city,'; }; "
        f'test "$(rows < totals.csv)" = {lines("Cairo,40", "Lima,25", "Oslo,25")} && '
        f'cp /check/orders.csv . && test "$(python by_city.py | rows)" = '
        f"{lines('Kyiv,7', 'Rome,12')}",
        solution_files={"by_city.py": t.BY_CITY},
        solution="python by_city.py > totals.csv",
        cheat_files={
            "by_city.py": 'print("Cairo,40\\nLima,25\\nOslo,25")\n',
            "totals.csv": "Cairo,40\nLima,25\nOslo,25\n",
        },
        cheat="python by_city.py",
    ),
    EvalTask(
        id="json-merge",
        kind="data",
        split="heldout",
        prompt="Write merge.py that joins users.json and scores.json (a score's user_id is a "
        'user\'s id) into merged.json: a list of {"name": ..., "score": ...} objects, highest '
        "score first. Run it.",
        files=t.MERGE_FILES,
        check_files=t.MERGE_CHECK_FILES,
        check=f"{t.SAME_JSON} /check/merged.json && cp /check/users.json /check/scores.json . && "
        f"rm merged.json && python merge.py && {t.SAME_JSON} /check/merged2.json",
        solution_files={"merge.py": t.MERGE},
        solution="python merge.py",
        cheat_files={"merge.py": t.MERGE_CHEAT},
        cheat="python merge.py",
    ),
    EvalTask(
        id="todo-file",
        kind="reading",
        split="heldout",
        prompt="TODO.md lists two changes to this project. Make them, and run `python main.py`.",
        files={
            "TODO.md": t.TODO,
            "mathx.py": "def double(x):\n    return 2 * x\n",
            "main.py": "from mathx import double\n\nprint(double(4))\n",
        },
        check=f'test "$(python main.py)" = {lines("8", "10")} && python -c "from mathx import '
        'clamp; assert (clamp(-3, 0, 10), clamp(5, 0, 10), clamp(11, 2, 7)) == (0, 5, 7)"',
        solution="printf '\\n\\ndef clamp(x, low, high):\\n    return max(low, min(x, high))\\n' "
        ">> mathx.py && sed -i '1s/.*/from mathx import clamp, double/' main.py && "
        "echo 'print(clamp(15, 0, 10))' >> main.py && python main.py",
        cheat="echo 'print(10)' >> main.py && python main.py",
    ),
    EvalTask(
        id="traceback-fix",
        kind="reading",
        split="heldout",
        prompt="`python app.py` crashed with the traceback in crash.log. Fix the bug where the "
        "traceback shows it, so that app.py prints the price.",
        files={
            "crash.log": t.CRASH,
            "app.py": t.VAT_APP,
            "shop/__init__.py": "",
            "shop/prices.py": t.PRICES,
            "shop/rates.py": 'VAT = {"DE": 0.19, "FR": 0.2}\n',
        },
        check='test "$(python app.py)" = 119.0 && python -c "from shop.prices import '
        "price_with_vat as p; assert (p(10, 'FR'), p(200, 'DE')) == (12.0, 238.0)\"",
        solution="sed -i 's/country.lower()/country.upper()/' shop/prices.py && python app.py",
        cheat_files={"app.py": "print(119.0)\n"},
        cheat="python app.py",
    ),
)
