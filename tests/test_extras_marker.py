"""``tests/conftest.py``'s ``@pytest.mark.extra(name, ...)``: a test that needs an extra beyond
install.sh's defaults is skipped, naming the extra and the install command, where a module the
extra provides is missing (and a module's ``start_early`` is not called for it); ``--extras-only``
runs only the marked tests (CI's second phase); a misspelt extra is a usage error."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import (DEFAULT_EXTRAS, EXTRA_MODULES, install_command, item_extras,
                      missing_extras_reason)

ROOT = Path(__file__).resolve().parents[1]


def test_every_extra_of_pyproject_has_its_modules_and_the_defaults_are_install_shs():
    import tomllib

    meta = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert set(EXTRA_MODULES) == set(meta["project"]["optional-dependencies"])
    assert all(EXTRA_MODULES.values())
    assert all("." not in m for mods in EXTRA_MODULES.values() for m in mods)  # top level only
    assert '${1:-' + ",".join(DEFAULT_EXTRAS) + '}' in (ROOT / "install.sh").read_text()


def test_the_reason_names_the_missing_extras_and_the_install_command(monkeypatch):
    import conftest

    monkeypatch.setitem(conftest._EXTRA_PRESENT, "ray", False)
    monkeypatch.setitem(conftest._EXTRA_PRESENT, "wandb", False)
    monkeypatch.setitem(conftest._EXTRA_PRESENT, "trackio", True)
    assert missing_extras_reason(["ray"]) == (
        "needs the 'ray' extra: bash install.sh train,eval,rlve,dev,trl,ray")
    assert missing_extras_reason(["wandb", "trackio"]) == (
        "needs the 'wandb' extra: bash install.sh train,eval,rlve,dev,trl,wandb,trackio")
    monkeypatch.setitem(conftest._EXTRA_PRESENT, "trackio", False)
    assert missing_extras_reason(["wandb", "trackio"]) == (
        "needs the 'wandb' and 'trackio' extras: bash install.sh train,eval,rlve,dev,trl,wandb,trackio")
    assert missing_extras_reason(["trackio"]).endswith("dev,trl,trackio")
    monkeypatch.setitem(conftest._EXTRA_PRESENT, "ray", True)
    assert missing_extras_reason(["ray"]) is None and missing_extras_reason([]) is None
    assert install_command(["train", "ray"]) == "bash install.sh train,eval,rlve,dev,trl,ray"


MARKED = '''
import pytest

import conftest

# as if Ray were missing and W&B and trackio installed (any module that exists stands in)
conftest.EXTRA_MODULES.update(ray=("no_such_module_for_spadekit_tests",), wandb=("json",),
                              trackio=("json",))
conftest._EXTRA_PRESENT.clear()


@pytest.mark.extra("ray")
def test_needs_ray():
    raise AssertionError("must be skipped")


@pytest.mark.extra("wandb", "trackio")
def test_needs_both():
    pass


def test_plain():
    pass
'''

MODULE_MARKED = '''
from pathlib import Path

import pytest

pytestmark = pytest.mark.extra("{extra}")


def start_early():  # called by conftest.py unless every selected test of the module is skipped
    Path(__file__).with_name("started_{extra}").write_text("")


def test_in_a_marked_module():
    assert "{extra}" != "ray", "must be skipped"
'''


def _session(suite: Path, *args: str) -> subprocess.CompletedProcess:
    """A one-process pytest session over ``suite`` with this suite's conftest.py as plugin."""
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider",
                           "-p", "conftest", str(suite), *args], cwd=suite,
                          capture_output=True, text=True, timeout=300,
                          env={**{k: v for k, v in os.environ.items()
                                  if not k.startswith(("PYTEST_XDIST_", "PYTEST_ADDOPTS"))},
                               "PYTHONPATH": str(ROOT / "tests"), "SPADEKIT_TEST_WORKERS": "0"})


def test_extras_only_runs_the_marked_tests_and_a_missing_extra_skips_with_its_command(tmp_path):
    suite = tmp_path / "suite"
    suite.mkdir()
    (suite / "pytest.ini").write_text("[pytest]\nmarkers =\n    extra: needs extras\n")
    (suite / "test_marked.py").write_text(MARKED)
    for extra in ("ray", "wandb"):
        (suite / f"test_module_{extra}.py").write_text(MODULE_MARKED.format(extra=extra))
    done = _session(suite, "--extras-only")
    out = done.stdout
    assert done.returncode == 0, out[-3000:] + done.stderr[-3000:]
    assert "2 passed, 2 skipped, 1 deselected" in out, out[-3000:]  # test_plain deselected
    reason = "needs the 'ray' extra: bash install.sh train,eval,rlve,dev,trl,ray"
    assert out.count(reason) == 2, out[-3000:]  # the test's mark and the module's
    assert not (suite / "started_ray").exists()  # nothing started for skipped tests only
    assert (suite / "started_wandb").exists()


def test_an_unknown_or_empty_extra_is_a_usage_error():
    class Item:
        nodeid = "t.py::test"

        def __init__(self, *marks):
            self.marks = [m.mark for m in marks]

        def iter_markers(self, name):
            assert name == "extra"
            return self.marks

    with pytest.raises(pytest.UsageError, match="t.py::test: unknown extra 'rayy'"):
        item_extras(Item(pytest.mark.extra("rayy")))
    with pytest.raises(pytest.UsageError, match="takes the names of extras"):
        item_extras(Item(pytest.mark.extra()))
    with pytest.raises(pytest.UsageError, match="takes the names of extras"):
        item_extras(Item(pytest.mark.extra(["ray"])))
    # the test's, class's and module's marks together, each extra once
    both = Item(pytest.mark.extra("wandb", "trackio"), pytest.mark.extra("wandb"))
    assert item_extras(both) == ["wandb", "trackio"]
