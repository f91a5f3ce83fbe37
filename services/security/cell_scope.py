"""Where one Python cell needs to connect (issue 27, item 6), as network_scope.py does for a
command: nothing for a cell that only computes, the hosts of the URLs it fetches with
urllib or requests, and no scope (the task's whole policy) for anything it cannot tell.

A cell runs in the task's kernel, where earlier cells' names live on (`s` may be a socket made
three cells ago), so a cell is placed only when every name it reads is one it binds itself, a
builtin that cannot reach the network, or a module it imports here from the lists below; it
reads no private attribute (`().__class__.__base__.__subclasses__()` reaches every class
loaded, sockets included; `random._os` the os module) and none named for a module that
connects (`uuid.os`, `urllib.request.socket`), calls no `exec`, `eval`, `compile` or
`__import__`, and imports nothing else. A narrowed scope only ever takes away: a cell placed
wrongly gets a 403 from the proxy that names the policy, never more than the task's policy.
"""

from __future__ import annotations

import ast

from .url_rules import host_rule

__all__ = ["cell_scope"]

# Modules that open no connection and run no other program.
_COMPUTING = frozenset(
    {
        "math", "cmath", "json", "re", "collections", "itertools", "functools", "statistics",
        "random", "datetime", "time", "string", "textwrap", "decimal", "fractions", "csv",
        "typing", "dataclasses", "hashlib", "base64", "pprint", "operator", "heapq", "bisect",
        "copy", "enum", "uuid", "zlib", "difflib", "unicodedata", "calendar", "array",
    }
)  # fmt: skip
# Modules that fetch URLs: placed by the URLs written in the cell, if every fetch names one.
_FETCHING = frozenset({"urllib", "requests"})
_BUILTINS = frozenset(
    {
        "print", "len", "range", "sum", "min", "max", "sorted", "enumerate", "zip", "list",
        "dict", "set", "frozenset", "tuple", "str", "int", "float", "bool", "bytes", "abs",
        "round", "isinstance", "map", "filter", "any", "all", "reversed", "repr", "divmod",
        "pow", "chr", "ord", "hex", "bin", "oct", "format", "hash", "iter", "next", "slice",
        "open", "input", "True", "False", "None", "Exception", "ValueError", "TypeError",
        "KeyError", "IndexError", "ZeroDivisionError", "StopIteration", "RuntimeError",
        "AssertionError", "AttributeError", "FileNotFoundError", "OSError", "NotImplementedError",
    }
)  # fmt: skip
_NEVER = frozenset({"exec", "eval", "compile", "__import__", "globals", "locals", "vars"})
# Modules reach others through their attributes (`uuid.os`, `urllib.request.socket`,
# `random._os`): no attribute named for one that connects or runs programs, none private.
_MODULE_ATTRS = frozenset(
    {
        "os", "sys", "subprocess", "socket", "ssl", "importlib", "builtins", "ctypes", "shutil",
        "multiprocessing", "asyncio", "select", "selectors", "posix", "pty", "platform", "http",
        "urllib3", "socketserver", "ftplib", "smtplib", "telnetlib", "xmlrpc", "packages",
        "compat", "modules",
    }
)  # fmt: skip


def _bound(tree: ast.AST) -> set[str]:
    """Every name the cell binds: assignments, loop and with targets, functions, classes,
    their parameters, imports, comprehension variables, `except ... as`."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store | ast.Del):
            names.add(node.id)
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.arg):
            names.add(node.arg)
        elif isinstance(node, ast.alias):
            names.add((node.asname or node.name).split(".")[0])
        elif isinstance(node, ast.ExceptHandler) and node.name:
            names.add(node.name)
    return names


def _imports(tree: ast.AST) -> set[str] | None:
    """The top-level modules the cell imports; None if it imports one not listed."""
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            modules = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level or node.module is None:
                return None
            modules = [node.module]
        else:
            continue
        for module in modules:
            top = module.split(".")[0]
            if top not in _COMPUTING | _FETCHING:
                return None
            found.add(top)
    return found


def cell_scope(code: str) -> tuple[str, ...] | None:
    """The egress rules the cell needs, or None when it cannot be told."""
    try:
        tree = ast.parse(code)
    except (SyntaxError, ValueError):
        return None  # not Python (an IPython `!command`?): the whole policy, as for a script
    imported = _imports(tree)
    if imported is None:
        return None
    own = _bound(tree)
    urls: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load):
            if node.id in _NEVER or (node.id not in own and node.id not in _BUILTINS):
                return None
        elif isinstance(node, ast.Attribute) and (
            node.attr.startswith("_") or node.attr in _MODULE_ATTRS
        ):
            return None
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            if (rule := host_rule(node.value)) is not None:
                urls.append(rule)
    if imported & _FETCHING:
        # Each fetch must name its URL in the cell, or it could go anywhere the policy allows.
        return tuple(dict.fromkeys(urls)) or None
    return ()
