"""a release exported with ``--include-removed`` hands its
blacklisted programs back through its ``games/`` directory (a directory of ``.py`` programs,
the route docs/pools.md gives for a release's game files): ``load_programs`` returns them, so
training, evaluation and registration take them, against "never returned as an environment
source"."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from report_run import build_run
from spadekit.common.errors import ConfigError
from spadekit.runs.pool_export import export_pool
from spadekit.runs.sources import load_programs
from spadekit.runs.store import RunStore


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Path:
    return build_run(tmp_path_factory.mktemp("review2-removed"), rounds=2)


def test_a_releases_games_directory_does_not_hand_back_removed_programs(run, tmp_path):
    copy = tmp_path / "run"
    shutil.copytree(run, copy)
    with RunStore.open(copy) as store:
        sha = next(r["sha256"] for r in store.environments()
                   if not (r.get("lineage") or {}).get("bootstrap")
                   and (r.get("validation") or {}).get("ok"))
        store.blacklist(sha, "gamed_printed_action", 1)
    out = tmp_path / "out"
    export_pool(copy, out, include_removed=True, parquet=False)
    assert sha not in {p.sha256 for p in load_programs(out)}
    with pytest.raises(ConfigError, match="games/ folder of an exported pool"):
        load_programs(out / "games")
