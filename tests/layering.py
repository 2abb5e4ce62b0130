"""The import-layering rules of a package tree, read from its package docstrings, and checked.

Every top-level package ``spadekit.X`` says in its ``__init__`` docstring where it sits and what
it may use, in two lines of its own:

    Layer 3: policy.
    May import: common, envs.

(``May import: nothing.`` for the bottom layer). :func:`check` walks every module's imports
(module level, inside functions and under ``if TYPE_CHECKING:`` alike: a type-only import is
still a dependency) and reports:

- a package without the two lines, or a module outside any package (besides ``__init__`` and
  ``__main__`` at the top);
- an import of another package that is not in the importer's ``May import`` list;
- a ``May import`` entry that is not strictly lower (a higher or equal layer number), so the
  lists themselves cannot describe a cycle;
- an import cycle between modules, also inside one package (an edge to a package means its
  ``__init__``; ``from P import name`` means the module ``P.name`` when that is a module).

Used by ``tests/test_layers.py`` on the real tree and on small trees made to break a rule.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass, field
from pathlib import Path

_LAYER = re.compile(r"^\s*Layer (\d+): ([\w, -]+)\.\s*$", re.M)
_MAY = re.compile(r"^\s*May import: ([\w, ]+)\.\s*$", re.M)


@dataclass
class Rule:
    package: str
    layer: int
    allowed: set[str] = field(default_factory=set)


@dataclass
class Report:
    rules: dict[str, Rule]
    problems: list[str]
    edges: dict[str, set[str]]


def _modules(src: Path, top: str) -> dict[str, Path]:
    """Module name -> file, for every ``.py`` file under ``src/top``."""
    out = {}
    for path in sorted((src / top).rglob("*.py")):
        parts = path.relative_to(src).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out[name] = path
    return out


def _imports(path: Path, name: str, modules: dict[str, Path], top: str) -> set[str]:
    tree = ast.parse(path.read_text(), str(path))
    is_pkg = path.name == "__init__.py"
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.split(".")[0] == top)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: resolve against this module's package
                pkg = name.split(".") if is_pkg else name.split(".")[:-1]
                pkg = pkg[:len(pkg) - node.level + 1]
                base = ".".join(pkg + ([base] if base else []))
            if base.split(".")[0] != top:
                continue
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                found.add(sub if sub in modules else base)
    return {m for m in found if m in modules and m != name}


def _rules(src: Path, top: str, problems: list[str]) -> dict[str, Rule]:
    rules = {}
    for init in sorted((src / top).glob("*/__init__.py")):
        pkg = init.parent.name
        doc = ast.get_docstring(ast.parse(init.read_text())) or ""
        layer, may = _LAYER.search(doc), _MAY.search(doc)
        if not layer or not may:
            problems.append(f"{top}.{pkg}: its __init__ docstring needs the lines "
                            "'Layer N: what.' and 'May import: a, b.' (or 'nothing.')")
            continue
        allowed = {p.strip() for p in may.group(1).split(",") if p.strip()} - {"nothing"}
        rules[pkg] = Rule(pkg, int(layer.group(1)), allowed)
    return rules


def _package(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else None


def _cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []
    counter = [0]

    def visit(v: str) -> None:
        work = [(v, iter(sorted(edges.get(v, ()))))]
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        while work:
            node, children = work[-1]
            for w in children:
                if w not in index:
                    index[w] = low[w] = counter[0]
                    counter[0] += 1
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(edges.get(w, ())))))
                    break
                if w in on:
                    low[node] = min(low[node], index[w])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    comp = []
                    while True:
                        w = stack.pop()
                        on.discard(w)
                        comp.append(w)
                        if w == node:
                            break
                    if len(comp) > 1:
                        out.append(sorted(comp))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return out


def check(src: Path, top: str = "spadekit") -> Report:
    """Check the tree ``src/top`` against the rules in its package docstrings."""
    problems: list[str] = []
    rules = _rules(src, top, problems)
    modules = _modules(src, top)
    edges = {name: _imports(path, name, modules, top) for name, path in modules.items()}
    for name in modules:
        if name.count(".") == 1 and _package(name) not in rules and \
                not (src / top / _package(name)).is_dir() and \
                name not in (f"{top}.__main__",):
            problems.append(f"{name}: a module at the top of {top}/; put it in the package of "
                            "its layer")
    for pkg, rule in rules.items():
        for other in sorted(rule.allowed):
            if other not in rules:
                problems.append(f"{top}.{pkg}: 'May import' names {other!r}, not a package")
            elif rules[other].layer >= rule.layer:
                problems.append(f"{top}.{pkg} (layer {rule.layer}) may import {top}.{other} "
                                f"(layer {rules[other].layer}): only lower layers")
    for name, targets in sorted(edges.items()):
        src_pkg = _package(name)
        if src_pkg not in rules:
            continue
        for target in sorted(targets):
            dst_pkg = _package(target)
            if dst_pkg is None or dst_pkg == src_pkg:
                continue
            if dst_pkg not in rules[src_pkg].allowed:
                problems.append(f"{name} imports {target}: {top}.{src_pkg} (layer "
                                f"{rules[src_pkg].layer}) may not import {top}.{dst_pkg}")
    for comp in _cycles(edges):
        problems.append("import cycle: " + " <-> ".join(comp))
    return Report(rules, problems, edges)
