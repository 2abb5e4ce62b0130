"""Parent side of the reference-contract compatibility layer: which compatibility features a
program uses, and the adapters applied to what a sandboxed program returns.

:func:`static_features` reads the source (never runs it) and names what the program relies on
(``spadekit validate --json`` reports them as ``details["compat"]``): ``name:<x>`` (a name used
without an import), ``ToolUseBaseEnv``, ``package:<p>`` and ``reset_without_options``. At run
time the sandbox adds ``solution_string`` and ``tools:<shape>`` (:func:`solution_of`,
:func:`tools_of`). Unlike the reference, exactly one ``...Env`` class is still required.
"""

from __future__ import annotations

import ast
import builtins
from typing import Any

from spadekit.envs import pyparse
from spadekit.envs.compat import BASE_MODULE, INJECTABLE, THIRD_PARTY
from spadekit.envs.schemas import SchemaError, normalize_tools, shape_of, solution_actions
from spadekit.common.errors import InvalidResult

__all__ = ["solution_of", "static_features", "tools_of"]

_BUILTINS = frozenset(dir(builtins))
_STDLIB_TOPS = frozenset(m for m, _ in INJECTABLE.values()) | {
    "os", "sys", "abc", "ast", "array", "base64", "bisect", "calendar", "cmath", "contextlib",
    "csv", "enum", "hashlib", "inspect", "io", "numbers", "pprint", "queue", "secrets",
    "struct", "textwrap", "types", "unicodedata", "uuid", "warnings", "zlib", "spadekit",
    "__future__", "importlib", "time", "datetime", "dataclasses", "typing", "decimal",
    "fractions", "string", "statistics", BASE_MODULE}


def _bound_names(tree: ast.Module) -> set[str]:
    """Names the module binds anywhere (imports, definitions, assignments, parameters...)."""
    bound: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            for alias in node.names:
                bound.add((alias.asname or alias.name).split(".")[0])
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            bound.add(node.name)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, (ast.Store, ast.Del)):
            bound.add(node.id)
        elif isinstance(node, ast.arg):
            bound.add(node.arg)
        elif isinstance(node, ast.ExceptHandler) and node.name:
            bound.add(node.name)
        elif isinstance(node, (ast.Global, ast.Nonlocal)):
            pass
    return bound


def static_features(code: str) -> list[str]:
    """The compatibility features ``code`` relies on (see the module docstring); ``[]`` for
    source that does not parse."""
    try:
        tree = pyparse.parse(code)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return []
    bound = _bound_names(tree)
    loaded = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)
              and isinstance(n.ctx, ast.Load)}
    features = {f"name:{n}" for n in loaded - bound - _BUILTINS
                if n in INJECTABLE or n in THIRD_PARTY}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            tops = [a.name.split(".")[0] for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            tops = [node.module.split(".")[0]]
        else:
            tops = []
        for top in tops:
            if top == BASE_MODULE:
                features.add("ToolUseBaseEnv")
            elif top not in _STDLIB_TOPS:
                features.add(f"package:{top}")
    env_classes = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name.endswith("Env")]
    if len(env_classes) == 1:
        cls = env_classes[0]
        if any(isinstance(b, ast.Name) and b.id == "ToolUseBaseEnv" for b in cls.bases):
            features.add("ToolUseBaseEnv")
        for item in cls.body:
            if isinstance(item, ast.FunctionDef) and item.name == "reset":
                args = item.args
                names = {a.arg for a in args.args + args.kwonlyargs}
                if "options" not in names and args.kwarg is None:
                    features.add("reset_without_options")
    return sorted(features)


def tools_of(raw: Any, where: str, used: set[str] | None = None) -> list[dict]:
    """Nested schemas of a program's raw ``tools()``/``get_tools()`` result; a malformed one
    raises ``InvalidResult(reason="bad_tools")`` naming the schema and ``where`` (the program).
    Records ``tools:<shape>`` in ``used`` when the shape was not nested."""
    shape = shape_of(raw)
    try:
        schemas = normalize_tools(raw, where=where)
    except SchemaError as exc:
        raise InvalidResult(str(exc), reason="bad_tools", op="tools") from None
    if used is not None and shape not in (None, "nested"):
        used.add(f"tools:{shape}")
    return schemas


def solution_of(raw: Any, tools: list[dict], used: set[str] | None = None) -> Any:
    """The actions of a string ``solution()`` (``raw`` unchanged when it is not a string);
    one that is not a sequence of tool calls and an answer raises
    ``InvalidResult(reason="not_replayable")``, which validation reports without failing."""
    if not isinstance(raw, str):
        return raw
    if used is not None:
        used.add("solution_string")
    actions = solution_actions(raw, tools)
    if actions is None:
        shown = raw if len(raw) <= 300 else raw[:297] + "..."
        raise InvalidResult(f"solution() returned a string that is not a sequence of tool "
                            f"calls and an answer, so it cannot be replayed: {shown!r}",
                            reason="not_replayable", op="solution")
    return actions
