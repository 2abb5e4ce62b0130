"""``spadekit pool export`` on a real finished run (tiny model, scripted designer: report_run.py):
what leaves, the numbers against hand SQL, byte-equal re-exports, the round trip through
``import-reference --release``, the Hugging Face dataset read offline with ``datasets``, and a
release read as untrusted (tampered, truncated, hostile manifests)."""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import subprocess
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from release_signing import resign
from report_run import build_run
from spadekit.cli.app import app
from spadekit.common.errors import ConfigError
from spadekit.runs.pool import load_pool
from spadekit.runs.pool_export import export_entries, export_pool
from spadekit.runs.release import ReleaseError, read_release
from spadekit.runs.store import RunStore


STREAM_KEY = "5ec2e7" * 5 + "ab"
"""The fixture run's secret stream key: it must not leave with the pool."""


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Path:
    return build_run(tmp_path_factory.mktemp("export"), stream_key=STREAM_KEY)


def sql(run: Path, query: str, params=()) -> list:
    conn = sqlite3.connect(f"file:{run / 'run.sqlite'}?mode=ro&immutable=1", uri=True)
    try:
        return conn.execute(query, params).fetchall()
    finally:
        conn.close()


def manifest(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "manifest.jsonl").read_text().splitlines()]


def files(out: Path) -> dict[str, bytes]:
    return {p.relative_to(out).as_posix(): p.read_bytes() for p in sorted(out.rglob("*"))
            if p.is_file()}


def with_blacklisted(run: Path, tmp_path: Path) -> tuple[Path, str]:
    """A copy of the run whose first designed program was taken out (gamed)."""
    copy = tmp_path / "run-copy"
    shutil.copytree(run, copy)
    sha = sql(copy, "SELECT sha256 FROM environments ORDER BY rowid LIMIT 1")[0][0]
    with RunStore.open(copy) as store:
        store.blacklist(sha, "gamed_printed_action", 1)
    return copy, sha


def test_what_leaves_a_run_is_its_validated_pooled_programs_with_hand_computed_stats(run,
                                                                                     tmp_path):
    out = tmp_path / "export"
    export_pool(run, out, license="mit", parquet=False)
    records = manifest(out)
    expected = sql(run, "SELECT sha256, hint, skill, status FROM environments WHERE status IN "
                        "('pooled', 'retired') AND json_extract(validation, '$.ok') "
                        "ORDER BY rowid")
    assert expected, "the fixture run pooled nothing"
    assert [(r["sha256"], r["hint"], r["skill"], r["status"]) for r in records] == \
        [tuple(row) for row in expected]
    for r in records:
        plays = sql(run, "SELECT with_hint, episode_return, step FROM plays WHERE env_sha = ?",
                    (r["sha256"],))
        free = [ret for hint, ret, _ in plays if not hint]
        hinted = [ret for hint, ret, _ in plays if hint]
        assert r["n_plays"] == len(free) and r["n_plays_with_hint"] == len(hinted)
        assert r["win_rate"] == pytest.approx(min(1, max(0, sum(free) / len(free))))
        born = r["created_step"]
        at_gen = [ret for hint, ret, step in plays if step == born and not hint]
        hint_at_gen = [ret for hint, ret, step in plays if step == born and hint]
        assert r["regret"] == pytest.approx(sum(hint_at_gen) / len(hint_at_gen)
                                            - sum(at_gen) / len(at_gen))
        memory = sql(run, "SELECT designer_reward FROM memory WHERE sha256 = ?", (r["sha256"],))
        assert r["designer_reward"] == (memory[0][0] if memory else None)
        assert r["actor_win_rate"] == r["win_rate"] and r["valid"] is True
        code = (out / r["game_file"]).read_text()
        assert code == sql(run, "SELECT code FROM environments WHERE sha256 = ?",
                           (r["sha256"],))[0][0]
    summary = json.loads((out / "validation_summary.json").read_text())
    assert summary["total"] == summary["valid"] == len(records) and summary["removed"] == {}
    assert subprocess.run(["sha256sum", "--quiet", "-c", "checksums.sha256"],
                          cwd=out).returncode == 0


def test_removed_programs_leave_only_with_the_flag_and_say_why(run, tmp_path):
    copy, sha = with_blacklisted(run, tmp_path)
    assert sha not in {e["program"].sha256 for e in export_entries(copy)[0]}
    entries = export_entries(copy, include_removed=True)[0]
    removed = [e for e in entries if e["program"].sha256 == sha]
    assert len(removed) == 1 and removed[0]["status"] == "blacklisted"
    assert removed[0]["removed_reason"] == "gamed_printed_action"
    assert all(e["removed_reason"] is None for e in entries if e["program"].sha256 != sha)
    out = tmp_path / "with-removed"
    summary = export_pool(copy, out, include_removed=True, parquet=False)
    assert summary["removed"] == {"gamed_printed_action": 1}
    assert json.loads((out / "snapshot_summary.json").read_text())["included"] == \
        "pooled and removed"


def test_two_exports_of_the_same_run_are_byte_equal_and_a_changed_run_is_not(run, tmp_path):
    export_pool(run, tmp_path / "a", license="mit")
    export_pool(run, tmp_path / "b", license="mit")
    assert files(tmp_path / "a") == files(tmp_path / "b")
    export_pool(run, tmp_path / "c", license="apache-2.0")
    assert files(tmp_path / "a")["README.md"] != files(tmp_path / "c")["README.md"]


def test_round_trip_through_import_reference_gives_the_same_programs_checks_and_stats(run,
                                                                                      tmp_path):
    out, pool = tmp_path / "export", tmp_path / "pool"
    export_pool(run, out, license="mit", parquet=False)
    res = CliRunner().invoke(app, ["import-reference", "--release", str(out), "--out", str(pool),
                                   "--json"])
    assert res.exit_code == 0, res.output
    summary = json.loads(res.output)
    assert summary["validation_changed"] == 0 and summary["rejected"] == 0
    records = {r["sha256"]: r for r in manifest(out)}
    checks = {json.loads(line)["sha256"]: json.loads(line)["validation"]
              for line in (out / "validation_manifest.jsonl").read_text().splitlines()}
    programs = load_pool(pool, strict=True)
    assert [p.sha256 for p in programs] == list(records)
    for program in programs:
        r = records[program.sha256]
        assert (program.code, program.hint, program.skill, program.class_name) == \
            ((out / r["game_file"]).read_text(), r["hint"], r["skill"], r["class_name"])
        stats = program.meta["reference_stats"]
        assert stats == {k: r[k] for k in stats} and set(stats) >= {"win_rate", "regret",
                                                                    "designer_reward"}
        mine = program.meta["validation"]
        assert (mine["ok"], mine["stage"], mine["reason"]) == \
            tuple(checks[program.sha256][k] for k in ("ok", "stage", "reason"))
        assert program.meta["lineage"]["release_game_file"] == r["game_file"]
        assert program.meta["lineage"]["created_step"] == r["created_step"]
    # the imported pool exports the same games, manifest statistics and checks again
    again = tmp_path / "again"
    export_pool(pool, again, parquet=False)
    assert [{k: r[k] for k in ("sha256", "hint", "skill", "win_rate", "regret",
                                "designer_reward", "n_plays", "valid")} for r in manifest(again)] \
        == [{k: r[k] for k in ("sha256", "hint", "skill", "win_rate", "regret",
                                "designer_reward", "n_plays", "valid")} for r in manifest(out)]
    assert sorted(p.read_bytes() for p in (again / "games").iterdir()) == \
        sorted(p.read_bytes() for p in (out / "games").iterdir())


def test_without_validation_the_release_reports_are_kept_verbatim(run, tmp_path):
    out, pool = tmp_path / "export", tmp_path / "pool"
    export_pool(run, out, parquet=False)
    res = CliRunner().invoke(app, ["import-reference", "--release", str(out), "--out", str(pool),
                                   "--no-validate"])
    assert res.exit_code == 0, res.output
    checks = [json.loads(line)["validation"]
              for line in (out / "validation_manifest.jsonl").read_text().splitlines()]
    kept = [p.meta["validation"] for p in load_pool(pool, strict=True)]
    assert [(k["ok"], k["stage"], k["reason"], k["class_name"]) for k in kept] == \
        [(c["ok"], c["stage"], c["reason"], c["details"]["class_name"]) for c in checks]


@pytest.mark.extra("trl")
def test_the_dataset_loads_offline_with_datasets_and_matches_the_manifest(run, tmp_path):
    out = tmp_path / "export"
    export_pool(run, out, license="apache-2.0", name="demo")
    code = (
        "import datasets, json, sys\n"
        "ds = datasets.load_dataset(sys.argv[1], split='train')\n"
        "print(json.dumps({'n': ds.num_rows, 'rows': ds.to_list()}))\n")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
           "HF_HOME": str(tmp_path / "hf-home")}
    done = subprocess.run([os.sys.executable, "-c", code, str(out)], capture_output=True,
                          text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    rows = json.loads(done.stdout.splitlines()[-1])["rows"]
    records = manifest(out)
    assert [r["sha256"] for r in rows] == [r["sha256"] for r in records]
    for row, record in zip(rows, records):
        assert row["code"] == (out / record["game_file"]).read_text()
        assert row["gym_id"] == f"spadekit/demo-{record['id']}"
        for key in ("hint", "skill", "status", "win_rate", "regret", "designer_reward",
                    "n_plays", "valid"):
            assert row[key] == record[key], key
        assert json.loads(row["lineage"]) == record["lineage"]
        assert json.loads(row["validation"])["ok"] is True
    card = (out / "README.md").read_text()
    from spadekit import __version__
    assert card.startswith("---\nlicense: apache-2.0\n") and f"spadekit {__version__}" in card
    assert "```yaml\nsetting: games" in card  # the run's config ...
    assert STREAM_KEY in (run / "config.yaml").read_text()
    assert "stream_key: withheld" in card  # ... without its secret
    assert all(STREAM_KEY.encode() not in data for data in files(out).values())
    for skill in {r["skill"] for r in records}:
        n = sum(r["skill"] == skill for r in records)
        assert f"| {skill} | {n} | 0 | {n} |" in card


def test_an_existing_directory_is_kept_unless_forced_and_a_failed_write_leaves_nothing(
        run, tmp_path, monkeypatch):
    out = tmp_path / "export"
    out.mkdir()
    (out / "mine.txt").write_text("keep me")
    with pytest.raises(ReleaseError, match="exists"):
        export_pool(run, out, parquet=False)
    assert (out / "mine.txt").read_text() == "keep me"

    import spadekit.runs.release as release

    def full_disk(*_a, **_k):
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(release, "_pretty", full_disk)
    with pytest.raises(ReleaseError, match="No space left"):
        export_pool(run, out, parquet=False, force=True)
    assert (out / "mine.txt").read_text() == "keep me"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["export"]  # no partial directory
    monkeypatch.undo()
    export_pool(run, out, parquet=False, force=True)
    assert not (out / "mine.txt").exists() and (out / "manifest.jsonl").is_file()


def test_sources_that_are_not_runs_or_pools_or_export_nothing_are_refused(tmp_path):
    source = tmp_path / "source"
    source.mkdir()
    with pytest.raises(ConfigError, match="not a run directory"):
        export_pool(source, tmp_path / "out")
    (source / "pool.jsonl").write_text("")
    with pytest.raises(ConfigError, match="no environment leaves"):
        export_pool(source, tmp_path / "out")
    with pytest.raises(ConfigError, match="write over or into"):
        export_pool(source, source / "out")
    res = CliRunner().invoke(app, ["pool", "export", str(tmp_path / "nope"), str(tmp_path / "o")])
    assert res.exit_code == 2 and "not a run directory" in " ".join(res.output.split())


# -- a release read as untrusted --------------------------------------------------------------


@pytest.fixture(scope="module")
def release(run, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("release") / "export"
    export_pool(run, out, parquet=False)
    return out


def test_a_changed_game_file_is_skipped_for_its_checksum(release, tmp_path):
    copy = tmp_path / "r"
    shutil.copytree(release, copy)
    first = manifest(copy)[0]
    with open(copy / first["game_file"], "a") as fh:
        fh.write("\nimport os; os.system('echo pwned')\n")
    programs, _checks, summary = read_release(copy)
    assert first["sha256"] not in {p.sha256 for p in programs}
    assert len(programs) == len(manifest(release)) - 1
    assert "does not match its checksum" in summary["skipped"][0]["why"]


def test_a_release_without_checksums_or_with_a_changed_manifest_is_refused(release, tmp_path):
    copy = tmp_path / "r"
    shutil.copytree(release, copy)
    (copy / "manifest.jsonl").write_text((copy / "manifest.jsonl").read_text().replace(
        '"hint": "', '"hint": "Answer: '))
    with pytest.raises(ReleaseError, match="manifest.jsonl does not match its checksum"):
        read_release(copy)
    (copy / "checksums.sha256").unlink()
    with pytest.raises(ReleaseError, match="no checksums.sha256"):
        read_release(copy)


def rewrite(copy: Path, records: list) -> None:
    """Replace the manifest and re-sign every file (an adversary who controls the release)."""
    (copy / "manifest.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    resign(copy)


def test_a_signed_but_hostile_manifest_cannot_reach_outside_games(release, tmp_path):
    copy = tmp_path / "r"
    shutil.copytree(release, copy)
    outside = tmp_path / "secret.py"
    outside.write_text("class StolenEnv:\n    pass\n")
    (copy / "games" / "link.py").symlink_to(outside)
    records = manifest(copy)
    hostile = [dict(records[0], game_file="games/../../secret.py"),
               dict(records[0], game_file="games/../manifest.jsonl"),
               dict(records[0], game_file="games/link.py"),
               dict(records[0], game_file="/etc/passwd"),
               dict(records[0], sha256="0" * 64),
               dict(records[0], hint=["not", "text"]),
               dict(records[0], win_rate="high")]
    rewrite(copy, hostile + records[1:])
    programs, _checks, summary = read_release(copy)
    assert len(programs) == len(records) - 1
    assert len(summary["skipped"]) == len(hostile)
    assert all(p.code != outside.read_text() for p in programs)


@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.dictionaries(st.sampled_from(["game_file", "sha256", "hint", "skill",
                                                 "win_rate", "meta", "lineage", "parents"]),
                                st.recursive(st.none() | st.booleans() | st.integers()
                                             | st.floats(allow_nan=False) | st.text(max_size=30),
                                             lambda c: st.lists(c, max_size=3)
                                             | st.dictionaries(st.text(max_size=5), c,
                                                               max_size=3),
                                             max_leaves=6)), max_size=4))
def test_any_manifest_records_are_read_or_skipped_never_crash(release, tmp_path_factory, records):
    copy = tmp_path_factory.mktemp("hyp") / "r"
    shutil.copytree(release, copy)
    rewrite(copy, records)
    programs, _checks, summary = read_release(copy)
    assert len(programs) + len(summary["skipped"]) == len(records)


def test_an_oversized_or_non_regular_game_file_is_skipped_before_it_is_read(release, tmp_path):
    copy = tmp_path / "r"
    shutil.copytree(release, copy)
    records = manifest(copy)
    with open(copy / "games" / "huge.py", "wb") as fh:
        fh.truncate(5 * 1024 * 1024)
    os.mkfifo(copy / "games" / "fifo.py")
    rewrite_all = [dict(records[0], game_file="games/huge.py"),
                   dict(records[0], game_file="games/fifo.py"), *records[1:]]
    (copy / "games" / "fifo.py").unlink()  # listed for signing as a regular file first ...
    rewrite(copy, rewrite_all)
    os.mkfifo(copy / "games" / "fifo.py")  # ... then swapped for a FIFO that would block a read
    programs, _checks, summary = read_release(copy)
    assert len(programs) == len(records) - 1
    whys = [s["why"] for s in summary["skipped"]]
    assert any("larger than" in w for w in whys) and any("not a regular file" in w or
                                                         "not listed" in w for w in whys)


def test_export_reads_the_run_without_writing_to_it(run, tmp_path):
    copy = tmp_path / "run"
    shutil.copytree(run, copy)
    for extra in ("run.sqlite-wal", "run.sqlite-shm"):
        (copy / extra).unlink(missing_ok=True)
    before = files(copy)
    export_pool(copy, tmp_path / "out", parquet=False)
    assert files(copy) == before  # no migration, no WAL, no -shm: a read-only run exports too


def test_conflicting_checksum_lines_are_refused(release, tmp_path):
    copy = tmp_path / "r"
    shutil.copytree(release, copy)
    first = (copy / "checksums.sha256").read_text().splitlines()[0]
    (copy / "checksums.sha256").write_text((copy / "checksums.sha256").read_text()
                                           + "0" * 64 + "  " + first.split("  ", 1)[1] + "\n")
    with pytest.raises(ReleaseError, match="second, different checksum"):
        read_release(copy)
