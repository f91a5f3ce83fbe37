"""One writer per Redis record (shared/redis_records.py), and the ACL that makes Redis enforce it.

The keys are found in the source (AST), like tests/unit/test_import_rules.py finds imports: every
key services/ and shared/ build (an f-string or a string starting `deckhands:`, or one starting
with a store's prefix, a `.format` template, a key a Lua script builds from its prefix) must be
a record of the table, and every record a key of the code. A store built with a prefix other
than its default would write keys the table does not know: no caller passes one.
"""

from __future__ import annotations

import ast
import fnmatch
import re
import sys
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import pytest

from shared.broker_permissions import ADMIN_USER, EGRESS_USER, REDIS_USERS, redis_acl, redis_rules
from shared.redis_records import RECORDS, RedisRecord, key_permissions, written_patterns

ROOT = Path(__file__).resolve().parents[2]
SCANNED = ("services", "shared")
TABLE = ROOT / "shared" / "redis_records.py"
KEY_START = "deckhands:"
SERVICES = tuple(user for user in REDIS_USERS if user not in (ADMIN_USER, EGRESS_USER))

# The second writers the table documents, and no others: adding one is a decision (say why in
# the table, and what ends it), made here too. None today: the gateway's writes of States went
# to the controller (creation requests, the deletions stream), its removal of the runtime's
# records to the runtime.
DOCUMENTED_SECOND_WRITERS: set[tuple[str, str]] = set()

# `prefix .. ':name'` (and `ARGV[1] .. ':name'`, the prefix passed as the first argument) in a
# Lua script: a key under the module's store prefix; `.. tenant` after it: one per value.
_LUA_KEY = re.compile(r"\b(?:prefix|ARGV\[1\])\s*\.\.\s*'(:[^']*)'(\s*\.\.)?")
_FORMAT_FIELD = re.compile(r"\{[^{}]*\}")


@dataclass(frozen=True)
class KeyLiteral:
    path: Path
    line: int
    glob: str

    def __str__(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}: {self.glob}"


class _Unresolved(Exception):
    pass


class _Module:
    """One source file, with what it takes to tell what a store's prefix is."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        self.parents: dict[ast.AST, ast.AST] = {}
        for node in ast.walk(self.tree):
            for child in ast.iter_child_nodes(node):
                self.parents[child] = node
        self.constants: dict[str, ast.expr] = {}
        self.functions: dict[str, ast.FunctionDef | ast.AsyncFunctionDef] = {}
        for stmt in self.tree.body:
            if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1:
                target = stmt.targets[0]
                if isinstance(target, ast.Name):
                    self.constants[target.id] = stmt.value
            elif isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
                if stmt.value is not None:
                    self.constants[stmt.target.id] = stmt.value
            elif isinstance(stmt, ast.FunctionDef | ast.AsyncFunctionDef):
                self.functions[stmt.name] = stmt
        # Functions imported from the project (`from shared.admission import seats_prefix`).
        self.imported: dict[str, Path] = {}
        package = path.parent
        for stmt in ast.walk(self.tree):
            if not isinstance(stmt, ast.ImportFrom) or not stmt.module:
                continue
            if stmt.level:
                base = package
                for _ in range(stmt.level - 1):
                    base = base.parent
                source = base / (stmt.module.replace(".", "/") + ".py")
            else:
                source = ROOT / (stmt.module.replace(".", "/") + ".py")
            if source.is_file():
                for alias in stmt.names:
                    self.imported[alias.asname or alias.name] = source

    def enclosing(self, node: ast.AST) -> list[ast.AST]:
        """The functions and classes around `node`, innermost first."""
        found = []
        while node in self.parents:
            node = self.parents[node]
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                found.append(node)
        return found

    # -- what an expression is, as a glob (each part not known until run time is a `*`)

    def resolve(self, expr: ast.expr, at: ast.AST, depth: int = 0) -> str:
        if depth > 12:
            raise _Unresolved(ast.unparse(expr))
        if isinstance(expr, ast.Constant) and isinstance(expr.value, str):
            return expr.value
        if isinstance(expr, ast.JoinedStr):
            return "".join(self._part(part, at, depth) for part in expr.values)
        if isinstance(expr, ast.Name):
            return self._name(expr.id, at, depth)
        if (
            isinstance(expr, ast.Attribute)
            and isinstance(expr.value, ast.Name)
            and expr.value.id in ("self", "cls")
        ):
            return self._attribute(expr.attr, at, depth)
        if isinstance(expr, ast.Call) and isinstance(expr.func, ast.Name):
            name = expr.func.id
            if name not in self.functions and name in self.imported:
                return _module(self.imported[name]).resolve(
                    ast.Call(func=ast.Name(id=name), args=[], keywords=[]), expr, depth + 1
                )
            function = self.functions.get(name)
            if function is not None and isinstance(function.body[-1], ast.Return):
                returned = function.body[-1].value
                if returned is not None:
                    return self.resolve(returned, returned, depth + 1)
        raise _Unresolved(ast.unparse(expr))

    def defines_prefix(self, node: ast.AST) -> bool:
        """Whether `node` is a key prefix being defined (`self.prefix = f"deckhands:llm:{m}"`,
        `return f"deckhands:seats:{pool}"` in seats_prefix), not a key."""
        parent = self.parents.get(node)
        if isinstance(parent, ast.Assign | ast.AnnAssign):
            targets = parent.targets if isinstance(parent, ast.Assign) else [parent.target]
            names = [getattr(t, "id", None) or getattr(t, "attr", "") for t in targets]
            return any(name.lower().endswith("prefix") for name in names)
        if isinstance(parent, ast.Return):
            scopes = self.enclosing(parent)
            return bool(scopes) and getattr(scopes[0], "name", "").endswith("prefix")
        return False

    def _part(self, part: ast.expr, at: ast.AST, depth: int) -> str:
        if isinstance(part, ast.Constant):
            return str(part.value)
        return "*"

    def _name(self, name: str, at: ast.AST, depth: int) -> str:
        for scope in self.enclosing(at):
            if not isinstance(scope, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            arguments = scope.args
            positional = [*arguments.posonlyargs, *arguments.args]
            names = [a.arg for a in positional]
            defaults = dict(
                zip(names[len(names) - len(arguments.defaults) :], arguments.defaults, strict=True)
            )
            for arg, default in zip(arguments.kwonlyargs, arguments.kw_defaults, strict=True):
                if default is not None:
                    defaults[arg.arg] = default
            if name in defaults:
                return self.resolve(defaults[name], scope, depth + 1)
            for node in ast.walk(scope):
                if (
                    isinstance(node, ast.Assign)
                    and len(node.targets) == 1
                    and isinstance(node.targets[0], ast.Name)
                    and node.targets[0].id == name
                ):
                    return self.resolve(node.value, node, depth + 1)
        if name in self.constants:
            return self.resolve(self.constants[name], self.constants[name], depth + 1)
        raise _Unresolved(name)

    def _attribute(self, attr: str, at: ast.AST, depth: int) -> str:
        for scope in self.enclosing(at):
            if not isinstance(scope, ast.ClassDef):
                continue
            for stmt in scope.body:  # a dataclass field, or a class attribute
                if (
                    isinstance(stmt, ast.AnnAssign)
                    and isinstance(stmt.target, ast.Name)
                    and stmt.target.id == attr
                    and stmt.value is not None
                ):
                    return self.resolve(stmt.value, stmt, depth + 1)
            for node in ast.walk(scope):
                if isinstance(node, ast.Assign | ast.AnnAssign):
                    targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                    for target in targets:
                        if (
                            isinstance(target, ast.Attribute)
                            and isinstance(target.value, ast.Name)
                            and target.value.id == "self"
                            and target.attr == attr
                            and node.value is not None
                        ):
                            return self.resolve(node.value, node, depth + 1)
            break
        raise _Unresolved(f"self.{attr}")

    def store_prefix(self) -> str:
        """The one prefix the module's stores use (what a Lua script's `prefix` is, and a
        `prefix` parameter without a default): every `self.prefix` of the module resolves to
        it, and there is one."""
        found = set()
        for node in ast.walk(self.tree):
            if isinstance(node, ast.Attribute) and node.attr == "prefix":
                if isinstance(node.value, ast.Name) and node.value.id == "self":
                    try:
                        found.add(self.resolve(node, node))
                    except _Unresolved:
                        continue
        if len(found) != 1:
            raise _Unresolved(f"{self.path}: the store prefix is one of {sorted(found)}")
        return found.pop()


@cache
def _module(path: Path) -> _Module:
    return _Module(path)


def _squeeze(glob: str) -> str:
    return re.sub(r"\*+", "*", glob)


def key_literals(path: Path) -> list[KeyLiteral]:
    """Every Redis key `path` builds, as a glob."""
    module = _module(path)
    found: list[KeyLiteral] = []
    inside_fstrings: set[int] = set()
    for node in ast.walk(module.tree):
        if isinstance(node, ast.JoinedStr):
            inside_fstrings.update(id(part) for part in ast.walk(node) if part is not node)
    for node in ast.walk(module.tree):
        if module.defines_prefix(node):
            continue
        if isinstance(node, ast.JoinedStr) and node.values:
            head, *rest = node.values
            if isinstance(head, ast.Constant):
                text = module.resolve(node, node)
                if text.startswith(KEY_START):
                    found.append(KeyLiteral(path, node.lineno, _squeeze(text)))
                continue
            assert isinstance(head, ast.FormattedValue)
            if not (rest and isinstance(rest[0], ast.Constant) and str(rest[0].value)[:1] == ":"):
                continue
            try:
                prefix = module.resolve(head.value, node)
            except _Unresolved:
                if not _prefix_like(head.value):
                    continue
                prefix = module.store_prefix()
            if prefix.startswith(KEY_START) or prefix == KEY_START.rstrip(":"):
                rest_glob = "".join(module._part(part, node, 0) for part in rest)
                found.append(KeyLiteral(path, node.lineno, _squeeze(prefix + rest_glob)))
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            if id(node) in inside_fstrings:
                continue
            text = node.value
            if text.startswith(KEY_START):
                found.append(KeyLiteral(path, node.lineno, _squeeze(_FORMAT_FIELD.sub("*", text))))
            elif "redis.call(" in text:
                for match in _LUA_KEY.finditer(text):
                    suffix = match.group(1) + ("*" if match.group(2) else "")
                    line = node.lineno + text[: match.start()].count("\n")
                    glob = _squeeze(module.store_prefix() + suffix)
                    found.append(KeyLiteral(path, line, glob))
    return found


def _prefix_like(expr: ast.expr) -> bool:
    if isinstance(expr, ast.Name):
        return expr.id in ("prefix", "_PREFIX")
    return isinstance(expr, ast.Attribute) and expr.attr in ("prefix", "_prefix")


def _python_files() -> list[Path]:
    files = []
    for folder in SCANNED:
        files += [p for p in (ROOT / folder).rglob("*.py") if "__pycache__" not in p.parts]
    return sorted(p for p in files if p != TABLE)


@cache
def code_keys() -> tuple[KeyLiteral, ...]:
    return tuple(key for path in _python_files() for key in key_literals(path))


def _module_path(module: str) -> Path:
    return ROOT / (module.replace(".", "/") + ".py")


# --- the table against the code ---------------------------------------------------------------


def test_the_code_builds_the_keys_it_is_known_to() -> None:
    """The scanner finds keys of each kind it reads: an f-string under a store's prefix, a
    literal, a `.format` template, a Lua script's key, one under a prefix made by a function."""
    globs = {key.glob for key in code_keys()}
    assert {
        "deckhands:task:*",  # f"{self.prefix}:task:{task_id}", prefix a parameter's default
        "deckhands:seat-weights",  # a constant
        "deckhands:repository:*",  # "deckhands:repository:{}".format(...)
        "deckhands:seats:*:ticket",  # only in a Lua script
        "deckhands:seats:*:q:*",  # prefix .. ':q:' .. tenant
        "deckhands:seats:*:owner",  # f"{prefix}:owner", prefix = seats_prefix(pool)
        "deckhands:llm:*:paused_until",
    } <= globs
    assert len(code_keys()) > 60


def test_every_key_the_code_builds_is_a_record() -> None:
    patterns = {record.pattern for record in RECORDS}
    unknown = [str(key) for key in code_keys() if key.glob not in patterns]
    assert not unknown, (
        "keys with no record in shared/redis_records.py (add one, naming its one writer):\n"
        + "\n".join(unknown)
    )


def test_every_record_is_a_key_of_its_module() -> None:
    built = {key.glob for key in code_keys()}
    stale = [record.pattern for record in RECORDS if record.pattern not in built]
    assert not stale, f"records no code builds a key of: {stale}"
    for record in RECORDS:
        path = _module_path(record.module)
        assert path.is_file(), f"{record.pattern}: no module {record.module}"
        assert record.pattern in {key.glob for key in key_literals(path)}, (
            f"{record.pattern}: {record.module} builds no such key (where does its code live?)"
        )


def _prefix_index(node: ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef) -> int | None:
    """Where a key prefix with a default comes among the positional arguments of a class or
    function (sys.maxsize: keyword only); None if it takes none (a `prefix` without a default
    is something else: an API key's prefix, a prefix passed on)."""
    if isinstance(node, ast.ClassDef):
        init = next(
            (s for s in node.body if isinstance(s, ast.FunctionDef) and s.name == "__init__"),
            None,
        )
        if init is None:  # a dataclass: its fields, in order
            fields = [
                (s.target.id, s.value is not None)
                for s in node.body
                if isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name)
            ]
            names = [name for name, _ in fields]
            if "prefix" in names and fields[names.index("prefix")][1]:
                return names.index("prefix")
            return None
        node = init
    arguments = node.args
    positional = [a.arg for a in [*arguments.posonlyargs, *arguments.args]]
    with_default = positional[len(positional) - len(arguments.defaults) :]
    if "prefix" in with_default:
        return [a for a in positional if a != "self"].index("prefix")
    for arg, default in zip(arguments.kwonlyargs, arguments.kw_defaults, strict=True):
        if arg.arg == "prefix" and default is not None:
            return sys.maxsize
    return None


def _imports_redis(tree: ast.Module) -> bool:
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("redis"):
            return True
        if isinstance(node, ast.Import) and any(a.name.startswith("redis") for a in node.names):
            return True
    return False


def test_no_store_is_built_with_another_prefix() -> None:
    """Every Redis store of services/ and shared/ that takes a key prefix is built with its
    default (the one the table's patterns are written with)."""
    takes_prefix: dict[str, int] = {}
    trees = {path: ast.parse(path.read_text(encoding="utf-8")) for path in _python_files()}
    for tree in trees.values():
        if not _imports_redis(tree):
            continue
        for node in tree.body:
            if isinstance(node, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
                index = _prefix_index(node)
                if index is not None:
                    takes_prefix[node.name] = index
    assert {"TaskStateStore", "SecretsStore", "TenantQuotas", "trajectory_key"} <= set(takes_prefix)
    problems = []
    for path, tree in trees.items():
        for node in ast.walk(tree):
            if not isinstance(node, ast.Call):
                continue
            func = node.func
            name = func.id if isinstance(func, ast.Name) else getattr(func, "attr", None)
            if name not in takes_prefix:
                continue
            if any(k.arg == "prefix" for k in node.keywords) or len(node.args) > takes_prefix[name]:
                problems.append(f"{path.relative_to(ROOT)}:{node.lineno}: {ast.unparse(node)}")
    assert not problems, "a store built with a prefix of its own:\n" + "\n".join(problems)


# --- the table itself ---------------------------------------------------------------------------


def test_each_record_has_one_writer_among_the_redis_users() -> None:
    patterns = [record.pattern for record in RECORDS]
    assert len(patterns) == len(set(patterns)), "a pattern listed twice"
    users = (*SERVICES, EGRESS_USER)
    for record in RECORDS:
        assert record.writer in users, record
        assert set(record.readers) <= set(users), record
        assert record.readers, record
        assert record.holds and record.module, record
        seconds = [w.service for w in record.second_writers]
        assert record.writer not in seconds, record
        assert set(seconds) <= set(SERVICES), record
        for second in record.second_writers:
            assert second.writes and second.until, second


def test_the_second_writers_are_exactly_the_documented_ones() -> None:
    listed = {(r.pattern, w.service) for r in RECORDS for w in r.second_writers}
    assert listed == DOCUMENTED_SECOND_WRITERS


def _intersect(a: str, b: str) -> bool:
    """Whether some key matches both globs (made of literal characters and `*`)."""

    @cache
    def step(i: int, j: int) -> bool:
        if i == len(a) and j == len(b):
            return True
        if i < len(a) and a[i] == "*":
            return step(i + 1, j) or (j < len(b) and step(i, j + 1))
        if j < len(b) and b[j] == "*":
            return step(i, j + 1) or (i < len(a) and step(i + 1, j))
        return i < len(a) and j < len(b) and a[i] == b[j] and step(i + 1, j + 1)

    return step(0, 0)


def test_glob_intersection() -> None:
    assert _intersect("deckhands:tenant:*", "deckhands:tenant:*:limits")
    assert _intersect("a:*:c", "a:b:*")
    assert not _intersect("deckhands:task:*", "deckhands:task-record:*")
    assert not _intersect("deckhands:runtime:*:task:*", "deckhands:task:*")
    assert not _intersect("deckhands:deadlines", "deckhands:deadlines:*")


def test_records_of_different_writers_share_no_key() -> None:
    """A key matching two records' patterns would be writable by both records' writers."""
    for i, one in enumerate(RECORDS):
        for other in RECORDS[i + 1 :]:
            if set(one.writers) != set(other.writers):
                assert not _intersect(one.pattern, other.pattern), (one.pattern, other.pattern)
    for record in RECORDS:
        assert set(record.pattern) <= set("abcdefghijklmnopqrstuvwxyz-_:*"), record.pattern


# --- the ACL, derived from the table -------------------------------------------------------------


def _acl_lines() -> dict[str, list[str]]:
    lines = redis_acl(lambda user: f"pw-{user}")
    by_user = {}
    for line in lines:
        words = line.split()
        assert words[0] == "user"
        by_user[words[1]] = words[2:]
    return by_user


def test_the_default_and_admin_users_are_as_before() -> None:
    lines = redis_acl(lambda user: f"pw-{user}")
    # The default user off but with every right: the append-only file's transactions replay as it.
    assert lines[0] == "user default off ~* &* +@all"
    assert f"user {ADMIN_USER} on >pw-{ADMIN_USER} ~* &* +@all" in lines
    assert sorted(_acl_lines()) == sorted(["default", *REDIS_USERS])


def test_the_egress_proxy_reaches_only_the_records_it_needs() -> None:
    """Issue 27: it reads secrets bound to hosts, which tasks may use them and the tenants'
    egress allowances, and writes only the egress bytes it counts; no other key at all (a
    State, a tenant's limits, a seat)."""
    words = _acl_lines()[EGRESS_USER]
    assert words[:2] == ["on", f">pw-{EGRESS_USER}"]
    rules = words[2:]
    assert rules == redis_rules(EGRESS_USER)
    assert [r for r in rules if "~" in r] == [
        "%R~deckhands:secrets:*",
        "%R~deckhands:task-secrets:*",
        "%R~deckhands:egress-allowances",
        "%RW~deckhands:egress-bytes:*:*",
    ]
    assert "+@all" not in rules and "-@dangerous" in rules
    assert not [r for r in rules if r.startswith(("~", "%W~", "allkeys", "&"))]


@pytest.mark.parametrize("service", SERVICES)
def test_each_service_reads_every_key_and_writes_its_records(service: str) -> None:
    words = _acl_lines()[service]
    assert words[:2] == ["on", f">pw-{service}"]
    rules = words[2:]
    assert (
        rules == redis_rules(service) == [*key_permissions(service), "&*", "+@all", "-@dangerous"]
    )
    keys = [rule for rule in rules if "~" in rule]
    assert keys[0] == "%R~*"
    assert keys[1:] == [f"%RW~{pattern}" for pattern in written_patterns(service)]
    assert not [rule for rule in rules if rule.startswith(("~", "%W~", "allkeys"))]
    owned = {r.pattern for r in RECORDS if service in r.writers}
    assert set(written_patterns(service)) == owned


def _writable_by(key: str) -> set[str]:
    """The users the ACL lets write `key`, by its patterns (Redis globs: fnmatch's, for `*`)."""
    allowed = set()
    for user, words in _acl_lines().items():
        if words[0] != "on":
            continue
        for rule in words:
            pattern = rule.removeprefix("%RW~") if rule.startswith("%RW~") else None
            if rule.startswith("~"):
                pattern = rule[1:]
            if pattern is not None and fnmatch.fnmatchcase(key, pattern):
                allowed.add(user)
    return allowed


@pytest.mark.parametrize("record", RECORDS, ids=lambda r: r.pattern)
def test_the_acl_lets_exactly_the_writers_write_a_record(record: RedisRecord) -> None:
    key = record.pattern.replace("*", "x")
    assert _writable_by(key) == {*record.writers, ADMIN_USER}


# --- the scanner catches what it claims to catch ------------------------------------------------


def test_scanner_finds_prefixed_formatted_and_lua_keys(tmp_path: Path) -> None:
    path = tmp_path / "store.py"
    path.write_text(
        "from redis.asyncio import Redis\n"
        "_PREFIX = 'deckhands'\n"
        "_KEY = 'deckhands:thing:{}'\n"
        "_LUA = \"redis.call('HSET', prefix .. ':held', t, 1)\\n"
        "redis.call('ZADD', prefix .. ':q:' .. t, 1, x)\"\n"
        "def box_prefix(pool):\n"
        "    return f'deckhands:box:{pool}'\n"
        "class Store:\n"
        "    def __init__(self, redis, pool, prefix=_PREFIX):\n"
        "        self.prefix = box_prefix(pool)\n"
        "        self.other = prefix\n"
        "        self.counter = f'{prefix}:counter'\n"
        "    def key(self, task):\n"
        "        return f'{self.prefix}:task:{task}'\n"
        "def lone(prefix, tenant):\n"
        "    return f'{prefix}:t:{tenant}'\n"
    )
    assert {key.glob for key in key_literals(path)} == {
        "deckhands:thing:*",
        "deckhands:box:*:held",
        "deckhands:box:*:q:*",
        "deckhands:counter",
        "deckhands:box:*:task:*",
        "deckhands:box:*:t:*",
    }
