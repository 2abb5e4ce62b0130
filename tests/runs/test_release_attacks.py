"""Attacks on pool export and release import: an unhashable record, one game file named many
times, newlines in a hint, a round trip that loses steps, removed programs leaving without the
flag, OUT onto the source, a non-finite statistic, a licence that breaks the card's YAML, never
validated programs, and the docs' Gymnasium id."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from release_signing import resign
from report_run import build_run
from spadekit.cli.app import app
from spadekit.common.errors import SpadekitError
from spadekit.runs.pool_export import export_pool
from spadekit.runs.release import read_release

STREAM_KEY = "ab12" * 8


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Path:
    return build_run(tmp_path_factory.mktemp("attacks"), rounds=2, stream_key=STREAM_KEY)


@pytest.fixture(scope="module")
def release(run, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("rel") / "release"
    export_pool(run, out, license="mit", parquet=False)
    return out


def _copy(release: Path, tmp_path: Path) -> Path:
    dst = tmp_path / "copy"
    shutil.copytree(release, dst)
    return dst


def _manifest(root: Path) -> list[dict]:
    return [json.loads(x) for x in (root / "manifest.jsonl").read_text().splitlines()]


def _write_manifest(root: Path, records: list[dict]) -> None:
    (root / "manifest.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))


def test_a_validation_record_with_an_unhashable_sha256_is_skipped_not_a_typeerror(release,
                                                                                   tmp_path):
    # a signed (re-checksummed) validation_manifest.jsonl whose sha256 is a list crashed
    # read_release, load_programs, pool register and import-reference with a raw TypeError
    root = _copy(release, tmp_path)
    path = root / "validation_manifest.jsonl"
    lines = path.read_text().splitlines()
    first = json.loads(lines[0])
    first["sha256"] = ["not", "hashable"]
    lines[0] = json.dumps(first)
    path.write_text("\n".join(lines) + "\n")
    resign(root)
    try:
        programs, _checks, _summary = read_release(root)
    except SpadekitError:
        return  # a typed refusal is acceptable too
    assert len(programs) == len(_manifest(root))
    res = CliRunner().invoke(app, ["import-reference", "--release", str(root), "--out",
                                   str(tmp_path / "pool"), "--no-validate"])
    assert res.exit_code in (0, 2) and not isinstance(res.exception, TypeError), res.output


def test_many_records_naming_one_game_file_hash_it_once(release, tmp_path, monkeypatch):
    # 200 manifest lines (6 KB) naming one 4 MiB game file took ~10 s: every record re-hashes
    # the file (O(records x file size); a 1 MB manifest takes about half an hour)
    import spadekit.runs.release as rel

    root = _copy(release, tmp_path)
    first = _manifest(root)[0]
    _write_manifest(root, [{"game_file": first["game_file"]}] * 200)
    resign(root)
    calls = []
    real = rel.sha256_file
    monkeypatch.setattr(rel, "sha256_file", lambda p: calls.append(p) or real(p))
    programs, _c, summary = read_release(root)
    assert len(programs) == 1
    assert len(calls) <= 5, f"{len(calls)} hashes for 200 records naming one file"


def test_a_release_hint_cannot_write_code_lines_into_the_imported_program_file(release,
                                                                               tmp_path):
    # import-reference writes programs/<id>.py with '# hint: {hint}' and '# skill: {skill}'
    # headers; a newline in an untrusted release's hint or skill becomes executable Python
    root = _copy(release, tmp_path)
    records = _manifest(root)
    records[0]["hint"] = "ok\nimport os; os.system('echo pwned')"
    records[0]["skill"] = "s\nprint('injected')"
    _write_manifest(root, records)
    resign(root)
    pool = tmp_path / "pool"
    res = CliRunner().invoke(app, ["import-reference", "--release", str(root), "--out",
                                   str(pool), "--no-validate"])
    assert res.exit_code == 0, res.output
    text = (pool / "programs" / f"{records[0]['id']}.py").read_text()
    header = text.split("\n\n", 1)[0]
    assert all(line.startswith("#") for line in header.splitlines()), header


def test_a_second_export_of_an_imported_pool_keeps_steps_and_game_files(release, tmp_path):
    # round trip: created_step / retired_step / rollout_id came back null and the game files
    # were renumbered (game_00001_000 -> game_00000_004); lineage gained the local path
    pool, again = tmp_path / "pool", tmp_path / "again"
    res = CliRunner().invoke(app, ["import-reference", "--release", str(release), "--out",
                                   str(pool)])
    assert res.exit_code == 0, res.output
    export_pool(pool, again, parquet=False)
    keys = ("sha256", "game_file", "created_step", "retired_step", "rollout_id", "status")
    assert [{k: r[k] for k in keys} for r in _manifest(again)] == \
        [{k: r[k] for k in keys} for r in _manifest(release)]
    assert all(str(release) not in json.dumps(r["lineage"]) for r in _manifest(again))


def test_a_blacklisted_program_does_not_leave_an_imported_pool_without_the_flag(run, tmp_path):
    from spadekit.runs.store import RunStore

    copy = tmp_path / "run"
    shutil.copytree(run, copy)
    with RunStore.open(copy) as store:
        sha = next(r["sha256"] for r in store.environments()
                   if not (r.get("lineage") or {}).get("bootstrap")
                   and (r.get("validation") or {}).get("ok"))
        store.blacklist(sha, "gamed_printed_action", 1)
    out, pool, again = tmp_path / "out", tmp_path / "pool", tmp_path / "again"
    export_pool(copy, out, include_removed=True, parquet=False)
    res = CliRunner().invoke(app, ["import-reference", "--release", str(out), "--out", str(pool)])
    assert res.exit_code == 0, res.output
    export_pool(pool, again, parquet=False)  # no include_removed
    statuses = [r["status"] for r in _manifest(again)]
    assert "blacklisted" not in statuses, statuses


def test_export_with_force_onto_its_own_source_refuses_and_keeps_the_run(run, tmp_path):
    # `spadekit pool export RUN RUN --force` (or OUT a parent of RUN) deleted the run
    copy = tmp_path / "run"
    shutil.copytree(run, copy)
    res = CliRunner().invoke(app, ["pool", "export", str(copy), str(copy), "--force"])
    assert (copy / "run.sqlite").is_file(), "the run database was deleted"
    assert res.exit_code == 2


def test_export_to_dot_with_force_is_a_typed_error(run, tmp_path, monkeypatch):
    # OUT '.' with --force: ValueError "PosixPath('.') has an empty name" traceback
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    res = CliRunner().invoke(app, ["pool", "export", str(run), ".", "--force"])
    assert not isinstance(res.exception, ValueError), res.output
    assert res.exit_code in (0, 2)


def test_a_non_finite_statistic_is_a_typed_error_and_leaves_no_partial_directory(run,
                                                                                    tmp_path):
    import sqlite3

    copy = tmp_path / "run"
    shutil.copytree(run, copy)
    conn = sqlite3.connect(copy / "run.sqlite")
    conn.execute("UPDATE memory SET designer_reward = 9e999 WHERE library = 0")
    conn.commit()
    conn.close()
    res = CliRunner().invoke(app, ["pool", "export", str(copy), str(tmp_path / "x")])
    leftovers = [p.name for p in tmp_path.iterdir() if p.name.startswith(".x.")]
    assert not leftovers, leftovers
    assert not isinstance(res.exception, ValueError), res.output


@pytest.mark.extra("trl")
@pytest.mark.parametrize("licence", ["a: b", "[unclosed"])
def test_a_licence_that_is_not_a_plain_word_still_gives_a_loadable_dataset(run, tmp_path,
                                                                           licence):
    # --license is pasted raw into the card's YAML header: the export succeeds, then
    # datasets.load_dataset(OUT) fails to parse the card
    import datasets

    out = tmp_path / "out"
    res = CliRunner().invoke(app, ["pool", "export", str(run), str(out), "--license", licence])
    if res.exit_code == 2:
        return  # refusing the licence is fine
    assert res.exit_code == 0, res.output
    ds = datasets.load_dataset(str(out), split="train")
    assert ds.num_rows > 0


def test_the_docs_gym_id_example_is_the_id_register_pool_gives(release):
    from spadekit.integrations.gym_pool import register_pool

    ids = register_pool(release, name="games-demo-docs")
    # docs/pools.md: register_pool("my-pool", name="games-demo") -> 'spadekit/games-demo-<sha>'
    assert ids[0].startswith("spadekit/games-demo-docs-"), ids[0]


def test_programs_never_validated_are_not_exported_as_valid(release, tmp_path):
    # import-reference --release --no-validate of a release without validation_manifest.jsonl,
    # then pool export: every program leaves with valid: true, validation
    # {"ok": true, "stage": "unknown"}, and the card says "validated in spadekit's sandbox"
    root = _copy(release, tmp_path)
    (root / "validation_manifest.jsonl").unlink()
    resign(root)
    pool, again = tmp_path / "pool", tmp_path / "again"
    res = CliRunner().invoke(app, ["import-reference", "--release", str(root), "--out", str(pool),
                                   "--no-validate"])
    assert res.exit_code == 0, res.output
    try:
        export_pool(pool, again, parquet=False)
    except SpadekitError:
        return  # refusing unvalidated programs is fine
    assert not any(r["valid"] for r in _manifest(again))
