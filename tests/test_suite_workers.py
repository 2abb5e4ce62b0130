"""``tests/conftest.py``'s default: the whole suite, or a directory of it, runs in pytest-xdist
workers (one per core, 2 to 4, each test file whole on one worker); named files and test ids run
in one process; ``SPADEKIT_TEST_WORKERS`` and ``-n`` decide when given."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import default_workers, usable_cpus

ROOT = Path(__file__).resolve().parents[1]


def test_directories_get_one_worker_per_core_files_and_ids_run_in_process(tmp_path):
    d = tmp_path / "tests"
    d.mkdir()
    f = d / "test_x.py"
    f.write_text("")
    assert default_workers([], {}, 2) == 2
    assert default_workers([str(d)], {}, 2) == 2
    assert default_workers([str(d)], {}, 1) == 2  # waits overlap even on one core
    assert default_workers([str(d)], {}, 16) == 4
    assert default_workers([str(f)], {}, 2) == 0
    assert default_workers([f"{f}::test_a"], {}, 2) == 0
    assert default_workers([str(d), str(f)], {}, 2) == 0
    assert default_workers([str(d)], {"SPADEKIT_TEST_WORKERS": "3"}, 2) == 3
    assert default_workers([str(f)], {"SPADEKIT_TEST_WORKERS": " 2 "}, 2) == 2
    assert default_workers([str(d)], {"SPADEKIT_TEST_WORKERS": "0"}, 2) == 0
    with pytest.raises(pytest.UsageError, match="SPADEKIT_TEST_WORKERS"):
        default_workers([str(d)], {"SPADEKIT_TEST_WORKERS": "many"}, 2)


TWO_TESTS = "def test_one():\n    pass\n\n\ndef test_two():\n    pass\n"


def _workers(where: Path, *args: str, **env: str) -> set[str]:
    """The ``created: N/N workers`` line of a pytest session over ``where`` (two trivial tests)
    with this suite's conftest.py as its plugin, or nothing when it ran in one process."""
    done = subprocess.run([sys.executable, "-m", "pytest", "-v", "-p", "no:cacheprovider",
                           "-p", "conftest", str(where), *args], cwd=where.parent,
                          capture_output=True, text=True, timeout=300,
                          env={**{k: v for k, v in os.environ.items()
                                  if not k.startswith("PYTEST_XDIST_")},  # a session of its own
                               "PYTHONPATH": str(ROOT / "tests"), **env})
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "2 passed" in done.stdout, done.stdout[-3000:]
    return {line for line in done.stdout.splitlines() if line.startswith("created: ")}


@pytest.mark.skipif(not importlib.util.find_spec("xdist"),
                    reason="pytest-xdist is not installed (pip install -e '.[dev]')")
def test_a_directory_runs_in_workers_unless_told_otherwise(tmp_path):
    suite = tmp_path / "suite"
    suite.mkdir()
    (suite / "test_two.py").write_text(TWO_TESTS)
    cores = max(2, min(usable_cpus(), 4))
    env = {"SPADEKIT_TEST_WORKERS": ""}
    assert _workers(suite, **env) == {f"created: {cores}/{cores} workers"}
    assert _workers(suite, "-n", "0", **env) == set()
    assert _workers(suite / "test_two.py", **env) == set()
    # what workers cannot give, or the user's own choice: one process
    for asks in (["-s"], ["--setup-show"], ["--dist=no"]):
        assert _workers(suite, *asks, **env) == set(), asks
    assert _workers(suite, PYTEST_ADDOPTS="--dist no", **env) == set()
    assert _workers(suite, "--maxprocesses", "1", **env) == {"created: 1/1 worker"}
    assert _workers(suite, "--dist", "load", **env) == {f"created: {cores}/{cores} workers"}
