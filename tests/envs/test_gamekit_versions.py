"""The game kit's released versions are frozen: each version folder's source is pinned here by
SHA-256, so any edit to a released version fails CI and a change of behaviour has to go into a
new version folder (a stored program keeps importing the version it was validated with). A
version imports only the standard library and its own modules: nothing outside its folder can
change what it does.

To release a version: add its folder, add it to ``spadekit.envs.gamekit.VERSIONS``, and pin
its hash below (the failure message of the first test prints it).
"""

from __future__ import annotations

import ast
import hashlib
import importlib
import sys
from pathlib import Path

import pytest

import spadekit.envs.gamekit as gamekit

KIT = Path(gamekit.__file__).resolve().parent
RELEASED = {
    "v1": "0d69f6eed57963db214c5f8717d7fa157ae805a7d0569ba5557131d9dd3d94f6",
}
"""Version -> SHA-256 of its folder's source (see :func:`folder_hash`). Never edit a line of
this table: a new version gets a new line."""


def folder_hash(folder: Path) -> str:
    """SHA-256 over the folder's ``.py`` files (recursively), each as its relative path, a NUL,
    its bytes and a NUL, in sorted path order."""
    digest = hashlib.sha256()
    for path in sorted(folder.rglob("*.py")):
        digest.update(path.relative_to(folder).as_posix().encode() + b"\0")
        digest.update(path.read_bytes() + b"\0")
    return digest.hexdigest()


@pytest.mark.parametrize("version", sorted(RELEASED))
def test_a_released_version_is_never_edited(version):
    got = folder_hash(KIT / version)
    assert got == RELEASED[version], (
        f"the released game kit {version} changed (sha256 {got}): stored programs that import "
        f"it would change behaviour. Put the change in a new version folder instead.")


def test_every_version_folder_is_released_and_pinned():
    folders = sorted(p.name for p in KIT.iterdir() if p.is_dir() and p.name != "__pycache__")
    assert folders == sorted(RELEASED) == sorted(gamekit.VERSIONS)
    assert gamekit.LATEST == gamekit.VERSIONS[-1]


@pytest.mark.parametrize("version", sorted(RELEASED))
def test_a_version_imports_only_the_standard_library_and_itself(version):
    for path in sorted((KIT / version).rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                tops = [alias.name.split(".")[0] for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:  # relative: must stay inside the version folder
                    depth = len(path.relative_to(KIT / version).parts) - 1
                    assert node.level <= depth + 1, f"{path.name} imports outside {version}"
                    continue
                tops = [node.module.split(".")[0]]
            else:
                continue
            for top in tops:
                assert top in sys.stdlib_module_names, f"{path.name} imports {top}"


@pytest.mark.parametrize("version", sorted(RELEASED))
def test_a_version_is_importable_by_its_name(version):
    module = importlib.import_module(f"spadekit.envs.gamekit.{version}")
    assert module.VERSION == version
    assert issubclass(module.KitError, ValueError) and callable(module.KitEnv)
    assert set(module.__all__) <= set(dir(module))


def test_every_program_records_the_kit_version_its_code_imports():
    from spadekit.envs.program import EnvProgram

    code = ("from spadekit.envs.gamekit.v1 import KitEnv, HiddenNumber, Probe, ScoreExact, "
            "OpenTurns\n\n\nclass AEnv(KitEnv):\n    theme = 'a'\n    hidden = HiddenNumber()\n"
            "    info = Probe()\n    scoring = ScoreExact()\n    turns = OpenTurns()\n")
    program = EnvProgram(code=code, meta={"gamekit": "v9", "x": 1})  # the code decides
    assert program.meta["gamekit"] == "v1" and program.meta["x"] == 1
    assert EnvProgram.from_dict(program.to_dict()).meta == program.meta
    assert "gamekit" not in EnvProgram(code="class BEnv:\n    pass\n").meta
