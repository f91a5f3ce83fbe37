"""The texts of the evaluation tasks' files: starting files, the hidden files of their checks
(reference tests, other input), reference solutions and cheats. The tasks are in tasks_dev.py
and tasks_heldout.py; kept here so that their tables read as tables."""

from __future__ import annotations

# ---- the development half (tasks_dev.py) ----

CALC_TEST = """from calc import add, mul


def test_add():
    assert add(2, 3) == 5
    assert add(-1, 1) == 0


def test_mul():
    assert mul(4, 5) == 20
"""

STATS_TEST = """from stats import mean, median


def test_mean():
    assert mean([1, 2, 3, 4]) == 2.5


def test_median():
    assert median([5, 1, 3]) == 3
    assert median([4, 1, 3, 2]) == 2.5
"""

PALINDROME_TEST = """from strings import is_palindrome


def test_is_palindrome():
    assert is_palindrome("Never odd or even")
    assert is_palindrome("abba")
    assert not is_palindrome("abc")
"""

SHAPES = """def sq_area(side):
    return side * side
"""

MAIN = """from shapes import sq_area

print(sq_area(3))
"""

REPORT_PY = """import json

with open("scores.json") as f:
    scores = json.load(f)

best = max(scores, key=lambda s: s["score"]
print(f"best: {best['name']} {best['score']}")
"""

GREET_PY = """import argparse


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("name")
    args = parser.parse_args()
    print(f"Hello, {args.name}!")


if __name__ == "__main__":
    main()
"""

TEXTUTIL = """import re


def slugify(text):
    \"\"\"'Hello World!' -> 'hello-world'\"\"\"
    words = re.findall(r"[a-z0-9]+", text.lower())
    return "-".join(words)
"""

PATCH = """--- a/version.py
+++ b/version.py
@@ -1,2 +1,2 @@
-VERSION = "1.0.0"
+VERSION = "1.1.0"
 NAME = "tool"
"""

SLUGIFY_TESTS = """import unittest

from textutil import slugify


class SlugifyTest(unittest.TestCase):
    def test_words(self):
        self.assertEqual(slugify("Hello World!"), "hello-world")


if __name__ == "__main__":
    unittest.main()
"""

STATS_FIXED = """def mean(xs):
    return sum(xs) / len(xs)


def median(xs):
    xs = sorted(xs)
    n = len(xs)
    if n % 2:
        return xs[n // 2]
    return (xs[n // 2 - 1] + xs[n // 2]) / 2
"""

STRINGS_FIXED = """def shout(s):
    return s.upper() + '!'


def is_palindrome(s):
    t = s.replace(" ", "").lower()
    return t == t[::-1]
"""

STRINGS_TESTS = """from strings import is_palindrome


def test_is_palindrome():
    assert is_palindrome("Abba")
    assert not is_palindrome("ab")
"""

GREET_FIXED = """import argparse


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

SQUARES_LITERAL = 'print("1\\n4\\n9\\n16\\n25\\n36\\n49\\n64\\n81\\n100")\n'


# ---- the held-out half (tasks_heldout.py) ----

FIZZ = """import sys

for i in range(1, int(sys.argv[1]) + 1):
    print(("Fizz" if i % 3 == 0 else "") + ("Buzz" if i % 5 == 0 else "") or i)
"""
FIZZ_REF = (
    'fb() { seq 1 "$1" | awk \'{ s = ""; if ($1 % 3 == 0) s = "Fizz"; '
    'if ($1 % 5 == 0) s = s "Buzz"; print (s == "" ? $1 : s) }\'; }; '
)
PAGES = '''def pages(items, size):
    """items in lists of at most `size` items, in order."""
    return [items[i : i + size] for i in range(0, len(items) - size, size)]
'''
PAGES_TEST = """from paginate import pages


def test_pages():
    assert pages([1, 2, 3, 4, 5], 2) == [[1, 2], [3, 4], [5]]
    assert pages([], 3) == []
"""
PAGES_HIDDEN = (
    PAGES_TEST
    + """

def test_more_pages():
    assert pages([1, 2], 2) == [[1, 2]]
    assert pages(list(range(7)), 3) == [[0, 1, 2], [3, 4, 5], [6]]
"""
)
INVENTORY = """class Inventory:
    def __init__(self):
        self.items = {}

    def add(self, name, count=1):
        self.items[name] = self.items.get(name, 0) + count
"""
INVENTORY_TEST = """import pytest

from inventory import Inventory


def test_add_and_count():
    inv = Inventory()
    inv.add("apple", 3)
    inv.add("apple")
    assert inv.count("apple") == 4
    assert inv.count("pear") == 0


def test_remove():
    inv = Inventory()
    inv.add("pear", 2)
    inv.remove("pear")
    assert inv.count("pear") == 1
    with pytest.raises(ValueError):
        inv.remove("pear", 2)
"""
INVENTORY_DONE = (
    INVENTORY
    + """
    def count(self, name):
        return self.items.get(name, 0)

    def remove(self, name, count=1):
        if self.count(name) < count:
            raise ValueError(f"only {self.count(name)} {name}")
        self.items[name] -= count
"""
)
ROMAN = '''_DIGITS = [(1000, "M"), (900, "CM"), (500, "D"), (400, "CD"), (100, "C"), (90, "XC"),
           (50, "L"), (40, "XL"), (10, "X"), (9, "IX"), (5, "V"), (4, "IV"), (1, "I")]


def to_roman(n):
    """n (1 to 3999) as a Roman numeral: to_roman(14) == "XIV"."""
    out = ""
    for value, digits in _DIGITS:
        while n >= value:
            out += digits
            n -= value
    return out
'''
LEAP = '''def is_leap(year):
    """Whether `year` is a leap year of the Gregorian calendar.

    >>> is_leap(2024)
    True
    >>> is_leap(1900)
    False
    >>> is_leap(2000)
    True
    """
    return year % 4 == 0
'''
LEAP_TEST = """from dates import is_leap


def test_is_leap():
    assert [is_leap(y) for y in (2024, 1900, 2000, 2023, 2100)] == [1, 0, 1, 0, 0]
"""
PACKAGE = """{
  "name": "demo",
  "version": "1.0.0",
  "scripts": {
    "start": "node index.js"
  },
  "license": "MIT"
}
"""
GREET = """import sys


def greet(name, greeting="Hello"):
    return f"{greeting}, {name}!"


if __name__ == "__main__":
    print(greet(sys.argv[1]))
"""
GEO_CONVERT = """from geo.units import KM_PER_MILE


def miles_to_km(miles):
    return miles / KM_PER_MILE


def km_to_miles(km):
    return km / KM_PER_MILE
"""
GEO_REPORT = """from geo.convert import miles_to_km


def describe(name, miles):
    return f"{name}: {miles_to_km(miles):.0f} km"
"""
GEO_TEST = """from geo.convert import km_to_miles, miles_to_km
from geo.report import describe


def test_convert():
    assert round(miles_to_km(10), 2) == 16.09
    assert round(km_to_miles(16.09344), 2) == 10.0


def test_describe():
    assert describe("run", 10) == "run: 16.1 km"
"""
GEO_HIDDEN = (
    GEO_TEST
    + """

def test_more():
    assert round(miles_to_km(1), 3) == 1.609
    assert describe("walk", 2) == "walk: 3.2 km"
"""
)
LOG = """2024-05-01 10:00:01 INFO start
2024-05-01 10:00:02 WARN disk 80%
2024-05-01 10:00:03 INFO request /a
2024-05-01 10:00:04 ERROR timeout /b
2024-05-01 10:00:05 INFO request /c
2024-05-01 10:00:06 ERROR timeout /d
2024-05-01 10:00:07 INFO stop
"""
LOG_HIDDEN = "".join(
    f"2024-06-01 09:00:0{i} {level} event {i}\n"
    for i, level in enumerate(["WARN", "DEBUG", "WARN", "INFO", "WARN", "INFO"])
)
LEVELS = """from collections import Counter

levels = Counter(line.split()[2] for line in open("app.log") if line.strip())
for level in sorted(levels):
    print(level, levels[level])
"""
BY_CITY = """import csv
from collections import defaultdict

totals = defaultdict(int)
for row in csv.DictReader(open("orders.csv")):
    totals[row["city"]] += int(row["amount"])
for city in sorted(totals):
    print(f"{city},{totals[city]}")
"""
MERGE = """import json

names = {u["id"]: u["name"] for u in json.load(open("users.json"))}
scores = json.load(open("scores.json"))
merged = [{"name": names[s["user_id"]], "score": s["score"]} for s in scores]
json.dump(sorted(merged, key=lambda m: -m["score"]), open("merged.json", "w"), indent=2)
"""
SAME_JSON = 'python -c "import json, sys; a, b = (json.load(open(p)) for p in sys.argv[1:]); '
SAME_JSON += 'assert a == b, a" merged.json'
CRASH = """Traceback (most recent call last):
  File "/workspace/app.py", line 3, in <module>
    print(price_with_vat(100, "DE"))
          ^^^^^^^^^^^^^^^^^^^^^^^^^
  File "/workspace/shop/prices.py", line 5, in price_with_vat
    return round(net * (1 + VAT[country.lower()]), 2)
                            ~~~^^^^^^^^^^^^^^^^^
KeyError: 'de'
"""
PRICES = """from shop.rates import VAT


def price_with_vat(net, country):
    return round(net * (1 + VAT[country.lower()]), 2)
"""
TODO = """# To do

- In mathx.py, add a function clamp(x, low, high) that returns x limited to low..high.
- At the end of main.py, print clamp(15, 0, 10).
"""
MERGE_FILES = {
    "users.json": '[{"id": 1, "name": "ann"}, {"id": 2, "name": "bo"}, {"id": 3, "name": "cy"}]\n',
    "scores.json": '[{"user_id": 2, "score": 70}, {"user_id": 1, "score": 95}, '
    '{"user_id": 3, "score": 40}]\n',
}
MERGED = '[{"name": "ann", "score": 95}, {"name": "bo", "score": 70}, {"name": "cy", "score": 40}]'
MERGE_CHECK_FILES = {  # the expected result, other input and its result
    "merged.json": MERGED,
    "users.json": '[{"id": 7, "name": "max"}, {"id": 9, "name": "lu"}]',
    "scores.json": '[{"user_id": 7, "score": 12}, {"user_id": 9, "score": 88}]',
    "merged2.json": '[{"name": "lu", "score": 88}, {"name": "max", "score": 12}]',
}
MERGE_CHEAT = f"open('merged.json', 'w').write({MERGED!r})\n"
FIZZ_CHEAT = (
    "print('"
    + "\\n".join("1 2 Fizz 4 Buzz Fizz 7 8 Fizz Buzz 11 Fizz 13 14 FizzBuzz".split())
    + "')\n"
)
ORDERS = "id,city,amount\n1,Oslo,20\n2,Lima,15\n3,Oslo,5\n4,Cairo,40\n5,Lima,10\n"
VAT_APP = 'from shop.prices import price_with_vat\n\nprint(price_with_vat(100, "DE"))\n'
