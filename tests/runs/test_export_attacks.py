"""pool export and release import after the first review's fixes.

- ``--force`` with OUT a symlink wipes the link's target, not the link (``write_release``
  resolves OUT first, so its ``out.is_symlink()`` branch can never run);
- OUT inside SOURCE with ``--force`` replaces part of the source (a pool's ``programs/``);
- odd pool lines (lineage or reference_stats not objects, parents an int, created_step or
  removed_reason an object) end the export with a raw AttributeError/TypeError;
- ``--license 'mit\\n'`` passes the licence check (``$`` matches before a final newline);
- many manifest records naming one large game file: still O(records x file size);
- from a pool directory, ``include_removed`` lets out any status, not only ``blacklisted``.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from release_signing import resign
from report_run import build_run
from spadekit.cli.app import app
from spadekit.common.errors import ConfigError
from spadekit.runs.pool_export import export_pool
from spadekit.runs.release import read_release


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Path:
    return build_run(tmp_path_factory.mktemp("review2"), rounds=2)


@pytest.fixture(scope="module")
def release(run, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("rel2") / "release"
    export_pool(run, out, parquet=False)
    return out


@pytest.fixture(scope="module")
def pool(release, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("pool2") / "pool"
    res = CliRunner().invoke(app, ["import-reference", "--release", str(release), "--out",
                                   str(out), "--no-validate"])
    assert res.exit_code == 0, res.output
    return out


def test_force_onto_a_symlink_replaces_the_link_not_its_target(run, tmp_path):
    target = tmp_path / "precious"
    target.mkdir()
    (target / "keep.txt").write_text("mine")
    link = tmp_path / "link"
    link.symlink_to(target)
    export_pool(run, link, parquet=False, force=True)
    assert (target / "keep.txt").is_file(), sorted(p.name for p in target.iterdir())


def test_force_onto_a_folder_inside_the_source_is_refused(pool, tmp_path):
    copy = tmp_path / "pool"
    shutil.copytree(pool, copy)
    before = sorted(p.name for p in (copy / "programs").iterdir())
    with pytest.raises(ConfigError):
        export_pool(copy, copy / "programs", parquet=False, force=True)
    assert sorted(p.name for p in (copy / "programs").iterdir()) == before


ODD = [
    (("meta", "lineage"), ["x"]),
    (("meta", "reference_stats"), [1]),
    (("meta", "lineage", "parents"), 5),
    (("meta", "lineage", "created_step"), {"a": 1}),
    (("meta", "lineage", "removed_reason"), {"x": [1]}),
]


@pytest.mark.parametrize("where,value", ODD, ids=lambda v: str(v))
def test_an_odd_pool_line_is_a_typed_error_or_skipped_never_a_traceback(pool, tmp_path, where,
                                                                         value):
    record = json.loads((pool / "pool.jsonl").read_text().splitlines()[0])
    node = record
    for key in where[:-1]:
        node = node[key]
    node[where[-1]] = value
    odd = tmp_path / "odd"
    odd.mkdir()
    (odd / "pool.jsonl").write_text(json.dumps(record) + "\n")
    res = CliRunner().invoke(app, ["pool", "export", str(odd), str(tmp_path / "out"),
                                   "--format", "release"])
    assert res.exit_code in (0, 2), (type(res.exception).__name__, res.exception)


def test_a_licence_with_a_trailing_newline_is_refused(run, tmp_path):
    with pytest.raises(ConfigError):
        export_pool(run, tmp_path / "out", license="mit\n", parquet=False)


def test_many_records_naming_one_large_game_file_read_it_once(release, tmp_path, monkeypatch):
    # the first fix hashes the file once, but each record still reads, decodes and hashes
    # (EnvProgram) the whole 4 MiB again: 300 records (a 19 KB manifest) take ~8 s
    root = tmp_path / "r"
    shutil.copytree(release, root)
    first = json.loads((root / "manifest.jsonl").read_text().splitlines()[0])
    game = root / first["game_file"]
    pad = "# " + "x" * 1000 + "\n"
    game.write_text(game.read_text() + pad * (4 * 1024 * 1024 // len(pad) - 2))
    (root / "manifest.jsonl").write_text(
        "".join(json.dumps({"game_file": first["game_file"]}) + "\n" for _ in range(300)))
    resign(root)
    import spadekit.runs.release as release_module

    built = []
    real = release_module.EnvProgram

    def counting(*args, **kwargs):
        built.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(release_module, "EnvProgram", counting)
    programs, _checks, summary = read_release(root)
    assert len(programs) == 1 and len(summary["skipped"]) == 299
    assert len(built) == 1  # the 4 MiB program is read, hashed and built once


def test_include_removed_from_a_pool_lets_out_only_blacklisted_programs(pool, tmp_path):
    lines = (pool / "pool.jsonl").read_text().splitlines()
    record = json.loads(lines[0])
    record["meta"]["lineage"]["status"] = "invalid"
    odd = tmp_path / "odd"
    odd.mkdir()
    (odd / "pool.jsonl").write_text(json.dumps(record) + "\n" + lines[1] + "\n")
    export_pool(odd, tmp_path / "out", include_removed=True, parquet=False)
    statuses = [json.loads(x)["status"] for x in
                (tmp_path / "out" / "manifest.jsonl").read_text().splitlines()]
    assert set(statuses) <= {"pooled", "retired", "blacklisted"}, statuses
