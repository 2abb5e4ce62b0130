"""The import layering of ``src/spadekit`` (issue 14): each package's ``__init__`` docstring says
its layer and what it may import; ``tests/layering.py`` checks every import against that, and
finds import cycles. Also: the checker fails on a deliberate upward import, a cycle, and a
package without the two lines, so the real tree's pass means something."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import layering

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src"


def test_the_real_tree_keeps_its_layers():
    report = layering.check(SRC)
    assert report.problems == []
    # the layers the README's map shows, bottom to top
    layers = {name: rule.layer for name, rule in report.rules.items()}
    assert layers == {"common": 0, "envs": 1, "sandbox": 2, "runs": 2, "policy": 3,
                      "rollout": 4, "train": 4, "eval": 5, "curriculum": 5, "report": 5,
                      "selfplay": 6, "integrations": 7, "cli": 8}
    top = sorted(p.name for p in (SRC / "spadekit").glob("*.py"))
    assert top == ["__init__.py", "__main__.py"]  # every module sits in the folder of its layer


@pytest.fixture
def tree(tmp_path):
    dst = tmp_path / "src"
    shutil.copytree(SRC / "spadekit", dst / "spadekit",
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "library", "static",
                                                  "presets", "data"))
    return dst


def _append(path: Path, text: str) -> None:
    path.write_text(path.read_text() + text)


def test_an_upward_import_fails(tree):
    _append(tree / "spadekit/sandbox/pool.py", "\nfrom spadekit.selfplay.loop import SelfPlay\n")
    problems = layering.check(tree).problems
    assert any("spadekit.sandbox.pool imports spadekit.selfplay.loop" in p for p in problems)


def test_an_upward_import_inside_a_function_or_type_check_fails(tree):
    _append(tree / "spadekit/envs/program.py",
            "\ndef _late():\n    from spadekit.rollout import engine\n    return engine\n")
    _append(tree / "spadekit/policy/base.py",
            "\nfrom typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
            "    import spadekit.runs.store\n")
    problems = layering.check(tree).problems
    assert any(p.startswith("spadekit.envs.program imports spadekit.rollout") for p in problems)
    assert any(p.startswith("spadekit.policy.base imports spadekit.runs.store") for p in problems)


def test_a_cycle_inside_a_package_fails(tree):
    # the cycle the layout removed: envs.extract <-> envs.program
    _append(tree / "spadekit/envs/program.py", "\nfrom spadekit.envs.extract import Extraction\n")
    problems = layering.check(tree).problems
    assert any(p.startswith("import cycle:") and "spadekit.envs.extract" in p
               and "spadekit.envs.program" in p for p in problems)


def test_a_package_without_its_layer_lines_and_a_stray_module_fail(tree):
    init = tree / "spadekit/report/__init__.py"
    init.write_text('"""The report, with no layer lines."""\n')
    (tree / "spadekit/stray.py").write_text('"""A module at the top."""\n')
    problems = layering.check(tree).problems
    assert any(p.startswith("spadekit.report: its __init__ docstring needs") for p in problems)
    assert any(p.startswith("spadekit.stray: a module at the top") for p in problems)


def test_a_may_import_list_naming_a_higher_layer_fails(tree):
    init = tree / "spadekit/envs/__init__.py"
    init.write_text(init.read_text().replace("May import: common.", "May import: common, cli."))
    problems = layering.check(tree).problems
    assert any("spadekit.envs (layer 1) may import spadekit.cli (layer 8)" in p
               for p in problems)


def test_public_entry_points_still_work():
    """The imports and commands the README shows."""
    from spadekit.cli import main
    from spadekit.sandbox import SandboxPool

    assert callable(main) and SandboxPool.__name__ == "SandboxPool"
    for argv in ([sys.executable, "-m", "spadekit", "--help"],
                 [sys.executable, "-m", "spadekit", "selfplay", "--dry-run", "--json"]):
        done = subprocess.run(argv, capture_output=True, text=True, timeout=300, cwd=ROOT,
                              env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(SRC),
                                   "HOME": str(ROOT), "COLUMNS": "100"})
        assert done.returncode == 0, done.stderr[-2000:]
    text = (ROOT / "pyproject.toml").read_text()
    assert 'spadekit = "spadekit.cli:main"' in text
