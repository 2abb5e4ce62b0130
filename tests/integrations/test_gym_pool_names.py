"""Gymnasium registration.

- ``_pool_name`` takes a release's name from ``snapshot_summary.json`` even when that file is
  not in ``checksums.sha256`` (``read_release`` ignores an unlisted snapshot and names the
  release by its directory): ids come from an unverified file;
- the same program with the same settings, registered from its run after its release (the
  docs' flow: export, then register), is refused as "other settings": the comparison is on
  the whole ``EnvProgram`` (its meta: lineage, release name), not the program and settings.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from report_run import build_run
from spadekit.runs.pool_export import export_pool


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Path:
    return build_run(tmp_path_factory.mktemp("review2-gym"), rounds=2)


@pytest.fixture(scope="module")
def release(run, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("review2-gym-rel") / "release"
    export_pool(run, out, parquet=False)
    return out


def test_an_unlisted_snapshot_does_not_name_the_ids(release, tmp_path):
    from spadekit.integrations.gym_pool import register_pool
    from spadekit.runs.release import read_release

    root = tmp_path / "rel"
    shutil.copytree(release, root)
    snap = json.loads((root / "snapshot_summary.json").read_text())
    snap["name"] = "spoofed-trusted-pool"
    (root / "snapshot_summary.json").write_text(json.dumps(snap))
    sums = root / "checksums.sha256"
    sums.write_text("".join(line + "\n" for line in sums.read_text().splitlines()
                            if "snapshot_summary" not in line))
    name = read_release(root)[0][0].meta["lineage"]["release"]
    ids = register_pool(root)
    assert "spoofed-trusted-pool" not in ids[0] and name in ids[0], (name, ids[0])


def test_the_same_programs_and_settings_from_the_run_are_not_other_settings(run, release):
    from spadekit.integrations.gym_pool import register_pool

    first = register_pool(release, name="review2-same")
    again = register_pool(run, name="review2-same")
    assert sorted(first) == sorted(again)
