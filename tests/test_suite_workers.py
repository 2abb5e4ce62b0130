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


CPUS_OF_A_CHILD = "import sys; sys.path.insert(0, sys.argv[1]); import conftest; print(conftest.usable_cpus())"


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="one CPU: nothing to narrow")
def test_usable_cpus_follow_the_affinity_mask():
    one = next(iter(os.sched_getaffinity(0)))
    code = f"import os; os.sched_setaffinity(0, {{{one}}})\n" + CPUS_OF_A_CHILD.replace("; ", "\n")
    done = subprocess.run([sys.executable, "-c", code, str(ROOT / "tests")],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split()[-1] == "1"


def _cpu_cgroup_dir() -> Path | None:
    for base in (Path("/sys/fs/cgroup/cpu"), Path("/sys/fs/cgroup/cpu,cpuacct")):
        if (base / "cpu.cfs_quota_us").exists() and os.access(base, os.W_OK):
            return base
    return None


@pytest.mark.skipif(_cpu_cgroup_dir() is None, reason="no writable cgroup v1 cpu controller")
def test_usable_cpus_follow_a_cgroup_cpu_quota():
    """A child moved into a cgroup with half a CPU of quota, or into an unlimited cgroup below
    it (a systemd slice, a pod), counts 1 usable CPU."""
    group = _cpu_cgroup_dir() / f"spadekit-test-cpus-{os.getpid()}"
    group.mkdir()
    inner = group / "unlimited"
    try:
        (group / "cpu.cfs_period_us").write_text("100000")
        (group / "cpu.cfs_quota_us").write_text("50000")
        inner.mkdir()
        for where in (group, inner):
            code = (f"import os; open({str(where / 'cgroup.procs')!r}, 'w')"
                    ".write(str(os.getpid()))\n" + CPUS_OF_A_CHILD.replace("; ", "\n"))
            done = subprocess.run([sys.executable, "-c", code, str(ROOT / "tests")],
                                  capture_output=True, text=True, timeout=120)
            assert done.returncode == 0, done.stderr[-2000:]
            assert done.stdout.split()[-1] == "1", where
    finally:
        if inner.exists():
            inner.rmdir()
        group.rmdir()


def test_odd_cgroup_files_never_stop_a_session(tmp_path, monkeypatch):
    """Lines without colons, a period of 0, a path that climbs out: skipped, never raised."""
    import conftest

    real = Path
    fake = tmp_path / "cgroup"
    fake.write_text("garbage\n\n1:cpu:/../../x\n0::/a:b\n")

    def path(*parts):
        joined = real(*parts)
        return fake if str(joined) == "/proc/self/cgroup" else joined

    monkeypatch.setattr(conftest, "Path", path)
    quota = conftest._cgroup_cpu_quota()
    assert quota is None or quota >= 1
    assert conftest.usable_cpus() >= 1
