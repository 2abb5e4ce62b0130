"""The report's data layer on a real run (tiny model, scripted designer; see report_run.py):
shapes, numbers against hand SQL and the store, read-only guarantees, errors, hostile text."""

from __future__ import annotations

import hashlib
import json
import shutil
import sqlite3
import threading
import time
from pathlib import Path

import pytest

from report_run import HOSTILE_MARK, HOSTILE_STRINGS, build_run
from spadekit.common.errors import SpadekitError
from spadekit.report import data
from spadekit.report.data import ReportError, RunReader


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Path:
    return build_run(tmp_path_factory.mktemp("report"))


@pytest.fixture(scope="module")
def snap(run):
    return data.snapshot(run)


def sql(run: Path, query: str, params=()) -> list:
    conn = sqlite3.connect(f"file:{run / 'run.sqlite'}?mode=ro&immutable=1", uri=True)
    try:
        return conn.execute(query, params).fetchall()
    finally:
        conn.close()


def copy_run(run: Path, tmp_path: Path) -> Path:
    target = tmp_path / "copy"
    shutil.copytree(run, target)
    return target


def tree_hash(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def strict_json(value) -> str:
    return json.dumps(value, allow_nan=False)


def test_snapshot_shape_rounds_and_metrics(run, snap):
    strict_json(snap)
    assert snap["format"] == "spadekit-report/1" and snap["generated_at"].endswith("+00:00")
    r = snap["run"]
    assert r["name"] == "run" and r["model"] == "tiny" and r["setting"] == "games"
    assert r["curriculum"] == "spade" and r["config"]["regen_interval"] == 1
    assert r["rounds_completed"] == 3 and r["latest_step"] == 2 and r["schema_version"] >= 2
    committed = [s for (s,) in sql(run, "SELECT step FROM rounds ORDER BY step")]
    assert [x["step"] for x in snap["rounds"]] == committed == [0, 1, 2]
    for rnd in snap["rounds"]:
        expected = dict(sql(run, "SELECT name, value FROM metrics WHERE step = ?",
                            (rnd["step"],)))
        assert rnd["metrics"] == pytest.approx(expected)
        assert isinstance(rnd["finished_at"], float)
        assert {"design", "validate", "hint", "play", "update"} <= set(rnd["timings"])
    assert snap["metric_names"] == sorted({n for (n,) in sql(run, "SELECT name FROM metrics")})
    assert {"agent_mean_return", "regret", "valid_share"} <= set(snap["metric_names"])
    assert snap["plateau"] == {"low": 0.4, "high": 0.6, "ramp": 0.25}
    assert snap["evals"] == [] and snap["warnings"] == []


def test_skills_win_rates_complexity_match_hand_sql(run, snap):
    step = 1
    rows = sql(run, "SELECT e.skill, p.env_sha, p.episode_return, p.turns FROM plays p JOIN "
                    "environments e ON e.sha256 = p.env_sha WHERE p.step = ? AND "
                    "p.with_hint = 0", (step,))
    assert rows
    by_skill: dict[str, list] = {}
    by_env: dict[str, list] = {}
    for skill, sha, ret, _turns in rows:
        by_skill.setdefault(skill, []).append((sha, ret))
        by_env.setdefault(sha, []).append(ret)
    for skill, plays in by_skill.items():
        entry = next(x for x in snap["skills"][skill] if x["step"] == step)
        assert entry["envs_played"] == len({sha for sha, _ in plays})
        assert entry["mean_return"] == pytest.approx(sum(r for _, r in plays) / len(plays))
        # the plateau's win rate is the mean return (clipped to [0, 1]); the share of plays
        # with return > 0 comes next to it
        mean = sum(r for _, r in plays) / len(plays)
        assert entry["win_rate"] == pytest.approx(min(1.0, max(0.0, mean)))
        assert entry["positive_share"] == pytest.approx(
            sum(r > 0 for _, r in plays) / len(plays))
        regrets = [e["regret"] for e in snap["environments"]
                   if e["skill"] == skill and e["created_step"] == step]
        assert entry["mean_regret"] == pytest.approx(sum(regrets) / len(regrets))
    wr = next(x for x in snap["win_rates"] if x["step"] == step)
    assert sorted(wr["values"]) == pytest.approx(
        sorted(min(1.0, max(0.0, sum(v) / len(v))) for v in by_env.values()))
    cx = next(x for x in snap["complexity"] if x["step"] == step)
    assert cx["mean_turns"] == pytest.approx(sum(t for *_, t in rows) / len(rows))
    codes = [c for (c,) in sql(run, "SELECT code FROM environments WHERE created_step = ? AND "
                                    "source LIKE 'designer%'", (step,))]
    assert cx["mean_code_lines"] == pytest.approx(
        sum(len(c.splitlines()) for c in codes) / len(codes))
    assert cx["mean_code_chars"] == pytest.approx(sum(map(len, codes)) / len(codes))
    assert [x["step"] for x in snap["complexity"]] == [0, 1, 2]


def test_environments_match_the_store(run, snap, tmp_path):
    from spadekit.runs.store import RunStore

    envs = snap["environments"]
    assert len(envs) == sql(run, "SELECT COUNT(*) FROM environments")[0][0] == 4
    assert [e["created_step"] for e in envs] == sorted((e["created_step"] for e in envs),
                                                       reverse=True)
    with RunStore.open(copy_run(run, tmp_path)) as store:
        stats = store.all_env_stats()
        memory = {r[0]: r[1] for r in store.query("SELECT sha256, designer_reward FROM memory")}
    for e in envs:
        s = stats[e["sha"]]
        assert e["short"] == e["sha"][:12] and e["origin"] == "designed"
        assert e["code_lines"] > 0 and e["code_chars"] > e["code_lines"] and e["has_hint"]
        assert (e["n_plays"], e["n_plays_with_hint"]) == (s["n_plays"], s["n_plays_with_hint"])
        assert e["win_rate"] == pytest.approx(s["win_rate"])
        assert e["positive_share"] == pytest.approx(s["positive_share"])
        assert e["regret"] == pytest.approx(s["regret_at_gen"])
        assert e["designer_reward"] == pytest.approx(memory.get(e["sha"]))
        assert e["mean_turns"] == pytest.approx(1.0)
    effects = snap["hint_effects"]
    assert effects and all(h["regret"] > 0 for h in effects)
    assert [h["regret"] for h in effects] == sorted((h["regret"] for h in effects), reverse=True)
    positive = [e for e in envs if e["regret"] is not None and e["regret"] > 0]
    assert len(effects) == min(10, len(positive))
    for h in effects:
        created = next(e["created_step"] for e in envs if e["sha"] == h["sha"])
        for key, hint in (("episode_without", 0), ("episode_with", 1)):
            assert sql(run, "SELECT env_sha, step, with_hint FROM episodes WHERE id = ?",
                       (h[key],)) == [(h["sha"], created, hint)]
    designed = {e["sha"] for e in envs if e["origin"] == "designed"}
    assert snap["timeline"] and all(set(t["envs"]) <= designed for t in snap["timeline"])
    assert [t["step"] for t in snap["timeline"]] == sorted(t["step"] for t in snap["timeline"])


def test_rejected_grouped_by_reason_with_examples(run, snap):
    rej = snap["rejected"]
    counts = dict(sql(run, "SELECT reason, COUNT(*) FROM rejected GROUP BY reason"))
    assert rej["total"] == sum(counts.values()) == 2
    assert {g["reason"]: g["count"] for g in rej["by_reason"]} == counts
    assert "near_duplicate" in counts
    for g in rej["by_reason"]:
        assert g["stage"] and 1 <= len(g["examples"]) <= 3
        ex = g["examples"][0]
        assert set(ex) == {"id", "step", "skill", "message", "sha", "text"} and ex["text"]
    dup = next(g for g in rej["by_reason"] if g["reason"] == "near_duplicate")["examples"][0]
    assert dup["sha"] and "class LettersEnv" in dup["text"]


def test_env_detail_code_hint_validation_episodes_and_hostile_text(run, snap):
    hostile = next(e["sha"] for e in snap["environments"]
                   if HOSTILE_MARK in sql(run, "SELECT code FROM environments WHERE sha256 = ?",
                                          (e["sha"],))[0][0])
    d = data.env_detail(run, hostile[:10].upper())  # a prefix, any case
    strict_json(d)
    env = d["env"]
    assert env["sha"] == hostile and env["origin"] == "designed"
    for text in HOSTILE_STRINGS:  # verbatim: escaping is the page's job
        assert text in env["code"] and text in env["hint"]
    assert env["code"] == sql(run, "SELECT code FROM environments WHERE sha256 = ?",
                              (hostile,))[0][0]
    assert env["validation"]["ok"] is True and env["validation"]["stage"] == "done"
    assert env["lineage"] == {"doc_id": env["lineage"]["doc_id"]} and env["parents"] == []
    assert env["blacklisted"] is None and isinstance(env["meta"], dict)
    eps = d["episodes"]
    assert 0 < len(eps) <= 6 and {e["with_hint"] for e in eps} == {True, False}
    assert [e["id"] for e in eps] == sorted((e["id"] for e in eps), reverse=True)
    assert set(eps[0]) == {"id", "step", "with_hint", "return", "turns", "stop_reason",
                           "failure"}
    two = data.env_detail(run, hostile, max_episodes=2)["episodes"]
    assert sorted(e["with_hint"] for e in two) == [False, True]
    with pytest.raises(ReportError, match="no environment"):
        data.env_detail(run, "0" * 64)
    with pytest.raises(ReportError, match="at least 8"):
        data.env_detail(run, hostile[:6])
    with pytest.raises(ReportError):
        data.env_detail(run, "'; DROP TABLE environments; --")


def test_episode_messages_and_turns(run, snap):
    eid = snap["hint_effects"][0]["episode_with"]
    ep = data.episode(run, eid)
    strict_json(ep)
    assert ep["id"] == eid and ep["with_hint"] is True and ep["hint"]
    assert [m["role"] for m in ep["messages"]][:2] == ["system", "user"]
    assert ep["hint"] in ep["messages"][1]["content"]
    assert len(ep["turns"]) >= 1 and ep["turns"][0]["idx"] == 0
    assert set(ep["turns"][0]) == {"idx", "action", "observation", "reward", "terminated",
                                   "truncated"}
    assert isinstance(ep["return"], float)
    with pytest.raises(ReportError, match="no episode"):
        data.episode(run, 10 ** 9)
    with pytest.raises(ReportError, match="not an episode"):
        data.episode(run, "abc")


def test_bundle_references_only_included_episodes(run, snap):
    b = data.bundle(run)
    text = strict_json(b)
    assert set(snap) <= set(b) and "details" in b and "episodes" in b
    assert set(b["details"]) == {e["sha"] for e in snap["environments"]}
    referenced = set()
    for sha, d in b["details"].items():
        assert d["env"]["sha"] == sha and "code" in d["env"]
        assert len(d["episodes"]) <= 2
        assert sorted(e["with_hint"] for e in d["episodes"]) == [False, True]
        referenced |= {e["id"] for e in d["episodes"]}
    for h in b["hint_effects"]:
        referenced |= {h["episode_without"], h["episode_with"]} - {None}
    assert set(b["episodes"]) == {str(i) for i in referenced}
    assert all(b["episodes"][str(i)]["id"] == i for i in referenced)
    small = data.bundle(run, max_episodes_per_env=1, max_envs=1)
    assert list(small["details"]) == [snap["environments"][0]["sha"]]
    assert len(small["episodes"]) <= 1 + 2 * len(small["hint_effects"])
    assert HOSTILE_STRINGS[0] in text or json.dumps(HOSTILE_STRINGS[0])[1:-1] in text


def test_reading_changes_no_byte_and_creates_no_file(run):
    before = tree_hash(run)
    with RunReader(run) as reader:
        s = reader.snapshot()
        reader.env_detail(s["environments"][0]["sha"])
        reader.episode(s["hint_effects"][0]["episode_with"])
    data.bundle(run)
    assert tree_hash(run) == before
    assert not (run / "run.sqlite-wal").exists() and not (run / "run.sqlite-shm").exists()


def test_reading_while_a_writer_holds_a_write_transaction(run, tmp_path):
    from spadekit.runs.store import RunStore

    live = copy_run(run, tmp_path)
    with RunStore.open(live) as store:
        sha = store.environments()[0]["sha256"]
        other = store.environments()[1]["sha256"]
        store.execute("UPDATE environments SET parents = ? WHERE sha256 = ?",
                      (json.dumps([other, "f" * 64]), sha))
        store.blacklist(sha, "timeout", 1)
        store.log_metrics(1, {"weird": 1.0})
        store.execute("UPDATE metrics SET value = 1e999 WHERE name = 'weird'")  # +inf
        long_obs = "<b>" + "x" * 50_000
        store.execute("UPDATE turns SET observation = ? WHERE episode_id = 1 AND idx = 0",
                      (long_obs,))
        done = threading.Event()
        with store.transaction():  # an open write transaction, as during a round
            store._sql("INSERT INTO rounds VALUES (3, 0, 0)")
            started = time.perf_counter()
            snap = data.snapshot(live)
            detail = data.env_detail(live, sha)
            ep = data.episode(live, 1)
            elapsed = time.perf_counter() - started
            done.set()
        strict_json(snap)
        assert done.is_set() and elapsed < 5
        assert snap["run"]["rounds_completed"] == 3  # the uncommitted round is not seen
        assert snap["rounds"][1]["metrics"]["weird"] is None  # inf -> None
        assert detail["env"]["blacklisted"] == "timeout"
        assert detail["env"]["parents"] == [
            {"sha": other, "short": other[:12], "skill": store.get_environment(other)["skill"],
             "in_run": True},
            {"sha": "f" * 64, "short": "f" * 12, "skill": None, "in_run": False}]
        obs = ep["turns"][0]["observation"]
        assert obs.startswith("<b>xxx") and obs.endswith("…[truncated 30003 chars]")
        assert len(obs) < 20_100
        after = data.snapshot(live)  # the writer committed: now visible
        assert after["run"]["rounds_completed"] == 4


def test_readers_and_a_writer_opening_and_closing_never_fail_each_other(run, tmp_path):
    """The dashboard polls while a run opens, commits and closes its database: no read may
    fail (that was a 503 in the browser) and, above all, no write may (a reader holding the
    WAL index read-only, SQLite's ``readonly_shm``, made the writer's BEGIN fail with
    SQLITE_READONLY in most rounds)."""
    from spadekit.runs.store import RunStore

    live = copy_run(run, tmp_path)
    stop, reads, read_errors = threading.Event(), [0], []

    def poll() -> None:
        while not stop.is_set():
            try:
                data.snapshot(live)
                reads[0] += 1
            except ReportError as exc:
                read_errors.append(str(exc))

    readers = [threading.Thread(target=poll) for _ in range(2)]
    for thread in readers:
        thread.start()
    try:
        for step in range(3, 33):
            with RunStore(live) as store, store.round(step):
                store.log_metrics(step, {"agent_mean_return": 0.5})
            time.sleep(0.005)
    finally:
        stop.set()
        for thread in readers:
            thread.join()
    assert read_errors == [] and reads[0] > 0
    assert data.snapshot(live)["run"]["rounds_completed"] == 33


def test_evals_warnings_and_a_v1_database(run, tmp_path):
    live = copy_run(run, tmp_path)
    (live / "evals").mkdir()
    (live / "evals" / "step-1.json").write_text(json.dumps({
        "format": "spadekit-eval-file/1", "model": "run@step-1", "suites": {"rg:tiny": {
            "suite": "rg:tiny", "summary": {"overall": {"win_rate": 0.5, "mean_score": 0.25},
                                            "groups": {"logic": {"win_rate": 1.0}},
                                            "datasets": {}}}}}))
    (live / "evals" / "step-2.json").write_text("{not json")
    conn = sqlite3.connect(live / "run.sqlite")
    conn.execute("DROP TABLE rejected")
    conn.commit()
    conn.close()
    snap = data.snapshot(live)
    assert snap["evals"] == [{"step": 1, "file": "evals/step-1.json", "suites": {"rg:tiny": {
        "overall": {"win_rate": 0.5, "mean_score": 0.25},
        "groups": {"logic": {"win_rate": 1.0}}}}}]
    assert len(snap["warnings"]) == 1 and "step-2.json" in snap["warnings"][0]
    assert snap["rejected"] == {"total": 0, "by_reason": []}


def test_missing_foreign_and_corrupt_runs_are_report_errors(tmp_path):
    with pytest.raises(ReportError, match="no run directory"):
        data.snapshot(tmp_path / "nope")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ReportError, match="not a spadekit run"):
        data.snapshot(tmp_path / "empty")
    garbage = tmp_path / "garbage"
    garbage.mkdir()
    (garbage / "run.sqlite").write_bytes(b"this is not sqlite at all" * 100)
    with pytest.raises(ReportError, match="not a SQLite database"):
        data.bundle(garbage)
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "run.sqlite").write_bytes(b"SQLite format 3\x00" + b"\xff" * 5000)
    with pytest.raises(ReportError):
        data.snapshot(broken)
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    conn = sqlite3.connect(foreign / "run.sqlite")
    conn.execute("CREATE TABLE t (x)")
    conn.commit()
    conn.close()
    with pytest.raises(ReportError, match="not a spadekit run") as info:
        data.episode(foreign, 1)
    assert isinstance(info.value, SpadekitError) and info.value.reason == "report"
    assert sorted(p.name for p in foreign.iterdir()) == ["run.sqlite"]


def test_a_new_run_without_rounds_in_an_awkward_path(tmp_path):
    from spadekit.runs.store import RunStore

    folder = tmp_path / "my run #1?x=%20"
    RunStore(folder, create=True).close()
    before = tree_hash(folder)
    snap = data.snapshot(folder)
    strict_json(snap)
    assert snap["run"]["rounds_completed"] == 0 and snap["run"]["latest_step"] is None
    assert snap["run"]["curriculum"] == "spade" and snap["run"]["config"] == {}
    assert snap["rounds"] == snap["environments"] == snap["timeline"] == []
    assert snap["hint_effects"] == [] and snap["rejected"]["total"] == 0
    assert snap["warnings"] == ["config.yaml is missing"]
    assert data.bundle(folder)["details"] == {} and tree_hash(folder) == before
