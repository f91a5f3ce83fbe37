"""The Redactor (shared/secret_redaction.py) finds a secret in every form programs print it in:
as it is, shell-quoted the ways bash and Python quote it, JSON- and Python-escaped, URL-encoded.
The forms are produced by the real programs here (bash's `set -x`, `printf %q`, `declare -p`;
Python's json, repr, shlex, urllib), not by a copy of the Redactor's own rules."""

from __future__ import annotations

import json
import shlex
import subprocess
import time
from urllib.parse import quote, quote_plus

import pytest

from shared.secret_redaction import Redactor, secret_forms

VALUES = {
    "QUOTED": "it's-a-s3cret",
    "EVERYTHING": 'it\'s "q" $x `b` \\ ~#,!*?[]{}()<>|&;^ tab\there\nnl é',
    "CONTROL": "esc\x1b bell\a del\x7f nul-free",
    "URLISH": "p@ss w/rd+&=?%",
    "PLAIN": "tok-0123456789abcdef",
}
_ENV = {"PATH": "/usr/bin:/bin", "LC_ALL": "C.UTF-8"}


def _bash(script: str, value: str, locale: str = "C.UTF-8") -> str:
    done = subprocess.run(
        ["bash", "--noprofile", "--norc", "-c", script, "_", value],
        capture_output=True,
        timeout=10,
        env={**_ENV, "LC_ALL": locale},
    )
    return done.stdout.decode("utf-8", "surrogateescape") + done.stderr.decode(
        "utf-8", "surrogateescape"
    )


def _printed(value: str) -> list[tuple[str, str]]:
    """(how, text) for each way the value is printed."""
    return [
        ("set -x", _bash('set -x; : "$1"; export "NAME=$1"; V=$1', value)),
        ("set -x, C locale", _bash('set -x; : "$1"', value, "C")),
        ("printf %q", _bash('printf "%q\\n" "$1"', value)),
        ("printf %q, C locale", _bash('printf "%q\\n" "$1"', value, "C")),
        ("printf %q inside a word", _bash('printf "%q\\n" "x=$1"', value)),
        ("declare -p", _bash('V=$1; declare -p V; export V; export -p | grep " V="', value)),
        ("shlex.quote", shlex.quote(value)),
        ("json.dumps", json.dumps({"v": value})),
        ("json.dumps ensure_ascii=False", json.dumps({"v": value}, ensure_ascii=False)),
        ("repr", repr(value) + repr([value, value + "'\""])),
        ("quote", f"https://h/?a={quote(value)}&b={quote(value, safe='')}"),
        ("quote_plus", f"a={quote_plus(value)}"),
        ("quote lower hex", quote(value, safe="").lower()),
    ]


@pytest.mark.parametrize("name", sorted(VALUES))
def test_every_printed_form_is_redacted(name: str) -> None:
    value = VALUES[name]
    redactor = Redactor({name: value})
    for how, text in _printed(value):
        if how == "quote lower hex" and "%" not in text:
            continue  # nothing to lower-case: the value itself, lower-cased, is not a form
        redacted = redactor.text(text)
        assert f"<secret:{name}>" in redacted, f"{how}: {text!r} -> {redacted!r}"
        for form in secret_forms(value)[0]:
            assert form not in redacted, f"{how}: {form!r} left in {redacted!r}"
        # The parts of the value that quoting does not touch do not survive either.
        for piece in ("s3cret", "tab", "here", "esc", "p@ss", "0123456789"):
            if piece in value:
                assert piece not in redacted, f"{how}: {piece!r} left in {redacted!r}"


def test_the_issue_s_example_is_redacted_quotes_and_all() -> None:
    value = "it's-" + "x" * 20
    trace = _bash('set -x; export "QUOTED=$1"; echo "$1"', value)
    assert "'QUOTED=it'\\''s-" in trace  # what the issue saw
    redacted = Redactor({"QUOTED": value}).text(trace)
    assert "+ export 'QUOTED=<secret:QUOTED>'" in redacted
    # The quoted token that is exactly the value is replaced whole, quotes included.
    assert "+ echo <secret:QUOTED>" in redacted


def test_a_json_string_keeps_its_quotes() -> None:
    redactor = Redactor({"PLAIN": VALUES["PLAIN"], "QUOTED": VALUES["QUOTED"]})
    text = json.dumps({"a": VALUES["PLAIN"], "b": VALUES["QUOTED"]})
    assert json.loads(redactor.text(text)) == {"a": "<secret:PLAIN>", "b": "<secret:QUOTED>"}


def test_overlapping_values_leave_nothing_of_either() -> None:
    redactor = Redactor({"A": "abcdef-123", "B": "xyz-abcd"})
    assert redactor.text("[xyz-abcdef-123]") == "[<secret:A>]"  # longest names the stretch
    assert redactor.text("xyz-abcd and abcdef-123") == "<secret:B> and <secret:A>"
    assert Redactor({"S": "aaaa"}).text("aaaaaa!") == "<secret:S>!"


def test_a_value_containing_another_is_named_as_itself() -> None:
    redactor = Redactor({"SHORT": "s3cr3t", "LONG": "s3cr3t-and-more"})
    assert redactor.text("x s3cr3t-and-more y s3cr3t") == "x <secret:LONG> y <secret:SHORT>"


def test_placeholders_are_left_alone_and_redacting_twice_changes_nothing() -> None:
    redactor = Redactor({"NAME": "secret", "Q": VALUES["EVERYTHING"]})
    once = redactor.text(f"<secret:NAME> {shlex.quote(VALUES['EVERYTHING'])} secret")
    assert once == "<secret:NAME> <secret:Q> <secret:NAME>"
    assert redactor.text(once) == once


def test_bytes_are_redacted_in_every_form_and_other_bytes_kept() -> None:
    value = VALUES["EVERYTHING"]
    redactor = Redactor({"Q": value})
    data = b"\xff\xfe raw " + value.encode() + b" json " + json.dumps(value).encode() + b" \x80"
    assert redactor.data(data) == b'\xff\xfe raw <secret:Q> json "<secret:Q>" \x80'
    clean = b"nothing here \xff"
    assert redactor.data(clean) is clean


def test_nothing_to_redact_is_cheap_and_returns_the_same_text() -> None:
    redactor = Redactor({f"S{i}": f"tok-{i:04d}-" + "k" * 30 for i in range(32)} | VALUES)
    text = ("an ordinary line of build output, 'quoted' and \"double\" $HOME\n" * 500)[:30_000]
    assert redactor.text(text) is text
    started = time.perf_counter()
    for _ in range(100):
        redactor.text(text)
    assert (time.perf_counter() - started) / 100 < 0.01  # well under 10 ms per observation
    assert not Redactor({}) and Redactor({}).text("x") == "x"


def test_a_text_cut_at_its_end_loses_what_is_left_of_a_value_there() -> None:
    redactor = Redactor({"QUOTED": VALUES["QUOTED"]})
    cut = "# Notes\nthe token is it'\\''s-a-s3"  # a bounded read stopped inside a quoted value
    assert redactor.text(cut, cut_end=True) == "# Notes\nthe token is <secret:QUOTED>"
    assert redactor.text(cut) == cut  # not known to be cut: a text like any other
    whole = "# Notes\nnothing secret here"
    assert redactor.text(whole, cut_end=True) == whole
