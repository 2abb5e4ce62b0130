"""The library: hand-written reference environment programs, one per skill.

Each ``*.py`` file in this package (other than this one) is a complete environment program as a
model would write it. Its metadata (``SKILL``, ``SETTING``, ``HINT``, ``TAGS`` and the module
docstring) is read statically with :mod:`ast`; the programs are never imported here.

Standard library only: sandbox workers import this package with site-packages disabled.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from spadekit.envs import pyparse

if TYPE_CHECKING:
    from spadekit.envs.program import EnvProgram

__all__ = ["LIBRARY_DIR", "LibraryEnv", "get", "list_library", "program", "read_metadata",
           "source"]

LIBRARY_DIR = Path(__file__).resolve().parent
SETTINGS = ("games", "tooluse")


@dataclass(frozen=True)
class LibraryEnv:
    """Static description of one library program."""

    name: str  # module stem, e.g. "games_code_breaker"
    path: Path
    skill: str
    setting: str  # "games" or "tooluse"
    hint: str
    tags: tuple[str, ...]
    doc: str  # first line of the module docstring


def read_metadata(path: Path) -> LibraryEnv:
    """Parse a program file's literal metadata; raise ValueError naming the file if invalid."""
    path = Path(path)
    try:
        tree = pyparse.parse(path.read_text(encoding="utf-8"), filename=str(path))
    except SyntaxError as exc:
        raise ValueError(f"{path.name}: not valid Python ({exc.msg}, line {exc.lineno})") from None
    values: dict[str, object] = {}
    for node in tree.body:
        targets = node.targets if isinstance(node, ast.Assign) else []
        if len(targets) == 1 and isinstance(targets[0], ast.Name):
            name = targets[0].id
            if name in ("SKILL", "SETTING", "HINT", "TAGS"):
                try:
                    values[name] = ast.literal_eval(node.value)
                except ValueError:
                    raise ValueError(f"{path.name}: {name} must be a literal") from None
    for field in ("SKILL", "SETTING", "HINT"):
        if not isinstance(values.get(field), str) or not values[field].strip():
            raise ValueError(f"{path.name}: missing or non-string {field}")
    tags = values.get("TAGS")
    if not isinstance(tags, (list, tuple)) or not all(isinstance(t, str) for t in tags):
        raise ValueError(f"{path.name}: TAGS must be a list of strings")
    if values["SETTING"] not in SETTINGS:
        raise ValueError(f"{path.name}: SETTING must be one of {SETTINGS}, "
                         f"got {values['SETTING']!r}")
    doc = ast.get_docstring(tree)
    if not doc:
        raise ValueError(f"{path.name}: missing module docstring")
    return LibraryEnv(name=path.stem, path=path, skill=values["SKILL"], setting=values["SETTING"],
                      hint=values["HINT"], tags=tuple(tags), doc=doc.strip().splitlines()[0])


def _program_paths() -> dict[str, Path]:
    return {p.stem: p for p in sorted(LIBRARY_DIR.glob("*.py")) if not p.name.startswith("_")}


def list_library() -> list[LibraryEnv]:
    """Every library program, sorted by name."""
    return [read_metadata(p) for p in _program_paths().values()]


def get(name: str) -> LibraryEnv:
    """The library program called ``name`` (module stem); KeyError lists the available names."""
    paths = _program_paths()
    if name not in paths:
        raise KeyError(f"no library environment {name!r}; available: {', '.join(paths)}")
    return read_metadata(paths[name])


def program(entry: LibraryEnv) -> EnvProgram:
    """``entry`` as an ``EnvProgram`` (its code, hint, skill, setting; source ``library:NAME``)."""
    from spadekit.envs.program import EnvProgram

    return EnvProgram(code=entry.path.read_text(encoding="utf-8"), hint=entry.hint,
                      skill=entry.skill, domain=entry.setting, source=f"library:{entry.name}")


def source(name: str) -> str:
    """The full source text of the library program called ``name``."""
    return get(name).path.read_text(encoding="utf-8")
