"""What a kit program is: its parts, their parameters, its own code and its theme, read from
the source without running it.

``kit_identity(code)`` returns a :class:`KitIdentity` for a program whose one ``...Env`` class
subclasses a released ``KitEnv``, else None; never raises. The near-duplicate gate, the pool
builder and the designer benchmarks use it: the same parts, parameters (normalised by building
the part: ``HiddenNumber()`` equals its explicit defaults) and own code (hooks the kit calls, a
non-default ``answer_verb``, part classes it writes; compared by canonical tokens) are a copy
whatever the theme; another composition is another game. Limitation: a kit name rebound at
module level is read by its written name.
"""

from __future__ import annotations

import ast
import importlib
from dataclasses import dataclass

from spadekit.envs import pyparse
from spadekit.envs.gamekit import PACKAGE, VERSIONS
from spadekit.envs.procedural.kit import KIT_PARTS
from spadekit.selfplay.canonical import canonical_tokens

__all__ = ["HOOKS", "KitIdentity", "PART_KEYS", "kit_identity"]

SLOTS = ("hidden", "info", "scoring", "turns")
HOOKS = ("intro", "command", "look", "verdict", "reminder", "solution")
"""The methods of ``KitEnv`` a program may override (the kit calls them)."""
PART_KEYS = {cls: key for slot in KIT_PARTS.values() for key, cls in slot.items()}
"""Kit part class -> its name in a composition key (``spadekit.envs.procedural.Combo``): the
procedural kit's registry read backwards."""


@dataclass(frozen=True)
class KitIdentity:
    """A kit program as the gate compares it (see the module docstring)."""

    version: str
    class_name: str
    theme: str | None
    parts: tuple[str, str, str, str]
    """The class of each slot (hidden, info, scoring, turns); ``own:<Name>`` for a part class
    the program writes."""
    params: tuple[str, str, str, str]
    """Each slot's parameters, normalised (``low=1,high=100``)."""
    own: tuple[tuple[str, str], ...]
    """``(what, canonical tokens)`` of each hook override, ``answer_verb`` and own part."""

    @property
    def composition(self) -> str:
        """``number+probe+steep+budget`` (own parts as ``own``), as ``Combo.key`` writes it."""
        return "+".join(PART_KEYS.get(p, "own") for p in self.parts)

    @property
    def overrides(self) -> tuple[str, ...]:
        """The names of the program's own code (hooks, own parts, ``answer_verb``)."""
        return tuple(name for name, _tokens in self.own)

    @property
    def key(self) -> tuple:
        """Equal exactly for copies: parts, parameters and own code (not theme or names)."""
        return (self.parts, self.params, self.own)

    def similarity(self, other: "KitIdentity") -> float:
        """1.0 for a copy; else the share of the four slots with the same part (a slot whose
        parameters differ counts 0.75), less 0.1 when the own code differs."""
        score = sum(1.0 if (a, pa) == (b, pb) else 0.75 if a == b else 0.0
                    for a, pa, b, pb in zip(self.parts, self.params, other.parts, other.params))
        return score / 4 - (0.0 if self.own == other.own else 0.1)


def _canonical(node: ast.AST) -> str:
    return " ".join(canonical_tokens(ast.unparse(node)))


def _kit_imports(tree: ast.Module) -> tuple[str | None, dict[str, str]]:
    """The kit version imported and local name -> kit name of what it imports."""
    version, names = None, {}
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            head, _, rest = node.module.partition(PACKAGE + ".")
            if head or rest not in VERSIONS:
                continue
            version = version or rest
            for alias in node.names:
                if alias.name == "*":
                    module = importlib.import_module(f"{PACKAGE}.{rest}")
                    names.update({n: n for n in module.__all__})
                else:
                    names[alias.asname or alias.name] = alias.name
    return version, names


def _params(version: str, kit_name: str, call: ast.Call) -> str:
    """The part's parameters as it holds them, or the call's arguments as written."""
    try:
        args = [ast.literal_eval(a) for a in call.args]
        kwargs = {k.arg: ast.literal_eval(k.value) for k in call.keywords if k.arg}
        if len(kwargs) != len(call.keywords):
            raise ValueError("**kwargs")
        part = getattr(importlib.import_module(f"{PACKAGE}.{version}"), kit_name)(*args, **kwargs)
        return ",".join(f"{p.name}={getattr(part, p.name)!r}" for p in type(part).PARAMS)
    except Exception:  # noqa: BLE001 - not literal or not valid: compared as written
        return ast.unparse(call)  # (too deep to unparse: kit_identity gives None)


def _forwarder(node: ast.AST) -> bool:
    """A hook whose body is only ``return super().<same name>(<its own arguments>)`` (after
    an optional docstring): it changes nothing."""
    body = [b for b in node.body if not (isinstance(b, ast.Expr) and
                                         isinstance(b.value, ast.Constant))]
    if len(body) != 1 or not isinstance(body[0], ast.Return):
        return False
    call = body[0].value
    args = [a.arg for a in node.args.args[1:]]
    return (isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute)
            and call.func.attr == node.name and isinstance(call.func.value, ast.Call)
            and isinstance(call.func.value.func, ast.Name) and call.func.value.func.id == "super"
            and not call.keywords and [getattr(a, "id", None) for a in call.args] == args)


def _empty_subclass(node: ast.ClassDef, names: dict[str, str]) -> str | None:
    """The kit part an own class only renames (one kit base, a body of ``pass`` or a
    docstring), else None."""
    if len(node.bases) != 1 or node.keywords or node.decorator_list:
        return None
    base = node.bases[0]
    if not isinstance(base, ast.Name) or names.get(base.id) not in PART_KEYS:
        return None
    empty = all(isinstance(b, ast.Pass) or (isinstance(b, ast.Expr) and
                                            isinstance(b.value, ast.Constant))
                for b in node.body)
    return names[base.id] if empty else None


def kit_identity(code: str) -> KitIdentity | None:
    """The identity of kit program ``code``; None when it is not one (or does not parse, or
    is nested too deep to read)."""
    try:
        return _identity(code)
    except (SyntaxError, ValueError, TypeError, RecursionError, MemoryError, ImportError,
            SystemError):
        return None


def _identity(code: str) -> KitIdentity | None:
    tree = pyparse.parse(code)
    version, names = _kit_imports(tree)
    if version is None:
        return None
    classes = {n.name: n for n in tree.body if isinstance(n, ast.ClassDef)}
    for name, node in classes.items():  # an own class that only renames a part is that part
        renamed = _empty_subclass(node, names)
        if renamed is not None:
            names[name] = renamed
    envs = [c for name, c in classes.items() if name.endswith("Env")]
    if len(envs) != 1 or not any(isinstance(b, ast.Name) and names.get(b.id) == "KitEnv"
                                 for b in envs[0].bases):
        return None
    env = envs[0]
    slots: dict[str, ast.AST] = {}
    own: list[tuple[str, str]] = []
    theme = None
    for node in env.body:
        if isinstance(node, ast.AnnAssign) and node.value is not None:
            target, value = node.target, node.value
        elif isinstance(node, ast.Assign) and len(node.targets) == 1:
            target, value = node.targets[0], node.value
        else:
            target = value = None
        if isinstance(target, ast.Name):
            name = target.id
            if name in SLOTS:
                slots[name] = value
            elif name == "theme" and isinstance(value, ast.Constant):
                theme = str(value.value)
            elif name == "answer_verb" and not (isinstance(value, ast.Constant)
                                                and value.value == "answer"):
                own.append(("answer_verb", ast.unparse(value)))
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and \
                node.name in HOOKS and not _forwarder(node):
            own.append((node.name, _canonical(node)))
    parts, params = [], []
    for slot in SLOTS:
        value = slots.get(slot)
        callee = value.func.id if isinstance(value, ast.Call) and \
            isinstance(value.func, ast.Name) else None
        if callee in names:
            parts.append(names[callee])
            params.append(_params(version, names[callee], value))
        elif callee in classes:
            parts.append(f"own:{callee}")
            params.append(ast.unparse(value))
            own.append((f"part:{slot}", _canonical(classes[callee])))
        else:
            parts.append("?" if value is None else ast.unparse(value)[:80])
            params.append("")
    return KitIdentity(version=version, class_name=env.name, theme=theme, parts=tuple(parts),
                       params=tuple(params), own=tuple(sorted(own)))
