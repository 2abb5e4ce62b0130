"""RunStore: schema, WAL, every method's round trip, round atomicity (exceptions and SIGKILL)."""

from __future__ import annotations

import json
import math
import os
import signal
import sqlite3
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from spadekit.envs.program import EnvProgram
from spadekit.runs.store import (
    SCHEMA_VERSION, RunStore, SchemaVersionError, StoreCorruptError, StoreError, StoreNotFound,
)
from spadekit.runs.schema import pack_array, unpack_array
from spadekit.sandbox.validate import ValidationReport

SRC = Path(__file__).resolve().parents[2] / "src"
TABLES = {"schema_version", "environments", "plays", "episodes", "turns", "memory",
          "delay_buffer", "blacklist", "hint_cache", "kv", "metrics", "events", "rounds",
          "checkpoints", "rejected", "rollout_queue", "token_ledger"}


def program(i: int = 0, skill: str = "Optimization") -> EnvProgram:
    code = (f"class Toy{i}Env:\n    def reset(self, seed=None, options=None):\n"
            "        return 'x', {}\n")
    return EnvProgram(code=code, hint=f"hint {i}", skill=skill, domain="games",
                      source=f"test:{i}", class_name=f"Toy{i}Env", meta={"n": i, "tags": ["a"]})


@pytest.fixture
def store(tmp_path):
    s = RunStore(tmp_path / "run", create=True)
    yield s
    s.close()


def test_schema_pragmas_and_reopen(tmp_path):
    run = tmp_path / "deep" / "run"
    with RunStore(run, create=True) as s:
        tables = {r[0] for r in s.query("SELECT name FROM sqlite_master WHERE type='table'")}
        assert TABLES <= tables
        assert s.query("PRAGMA journal_mode")[0][0] == "wal"
        assert s.query("PRAGMA foreign_keys")[0][0] == 1
        assert s.query("PRAGMA synchronous")[0][0] == 1  # NORMAL
        assert s.schema_version == SCHEMA_VERSION == 3
        assert s.path == run / "run.sqlite" and s.path.exists()
    with RunStore.open(run, synchronous="FULL") as s:
        assert s.query("PRAGMA synchronous")[0][0] == 2
        assert s.integrity_check() == ["ok"]
        assert len(s.query("SELECT * FROM schema_version")) == 3  # no repeated migration
    with RunStore(run, create=True) as s:  # create=True opens an existing run as is
        assert s.schema_version == 3
    with pytest.raises(StoreNotFound):
        RunStore.open(tmp_path / "nothing")
    with pytest.raises(StoreError):
        RunStore(tmp_path / "x", create=True, synchronous="OFF")


def test_environment_round_trip(store):
    p = program(1)
    report = ValidationReport(True, "done", "ok", "valid", {"max_turns": 12}, p)
    assert store.add_environment(p, step=3, parents=["aa", "bb"], lineage={"negative": "cc"},
                                 validation=report, designer_sample_id="s-7") == p.sha256
    row = store.get_environment(p.sha256)
    assert row["parents"] == ["aa", "bb"] and row["lineage"] == {"negative": "cc"}
    assert row["validation"] == json.loads(json.dumps(report.to_dict()))
    assert row["meta"] == {"n": 1, "tags": ["a"]}
    assert (row["status"], row["created_step"], row["designer_sample_id"]) == ("pooled", 3, "s-7")
    assert store.get_program(p.sha256) == p
    assert store.has_environment(p.sha256) and not store.has_environment("0" * 64)
    with pytest.raises(StoreError, match="already stored"):
        store.add_environment(p)
    assert store.add_environment(p, exist_ok=True) == p.sha256
    q = program(2)
    store.add_environment(q, step=4, status="invalid")
    assert store.pool() == [p]
    assert store.pool(active_only=False) == [p, q]
    store.set_status(p.sha256, "retired", step=9)
    row = store.get_environment(p.sha256)
    assert (row["status"], row["retired_step"]) == ("retired", 9)
    assert store.pool() == [] and [r["sha256"] for r in store.environments("invalid")] == [q.sha256]
    with pytest.raises(StoreError):
        store.set_status(p.sha256, "gone")
    with pytest.raises(StoreNotFound):
        store.set_status("f" * 64, "retired")
    with pytest.raises(StoreNotFound):
        store.get_environment("f" * 64)


def test_plays_win_rate_and_regret_by_sql(store):
    p = program(1)
    store.add_environment(p, step=2)
    # step 2 (generation): no hint 1 of 4 wins (returns .5, 0, 0, 0); hint: 1.0, 0.5, 0, 0.5
    for r in (0.5, 0.0, 0.0, 0.0):
        store.record_play(p.sha256, 2, with_hint=False, episode_return=r, seed=1)
    store.record_plays([dict(env_sha=p.sha256, step=2, with_hint=True, episode_return=r)
                        for r in (1.0, 0.5, 0.0, 0.5)])
    # step 3: no hint 3 of 4 wins; one crash
    store.record_play(p.sha256, 3, with_hint=False, episode_return=1.0, turns=4, tokens=99)
    store.record_play(p.sha256, 3, with_hint=False, episode_return=1.0)
    store.record_play(p.sha256, 3, with_hint=False, episode_return=0.2)
    store.record_play(p.sha256, 3, with_hint=False, episode_return=0.0, failure="timeout")
    stats = store.env_stats(p.sha256)
    assert stats["n_plays"] == 8 and stats["n_plays_with_hint"] == 4
    # win rate = mean return (the reference's): (.5 + 1 + 1 + .2) / 8 = 2.7 / 8, whole life,
    # no hint only; with the hint (1 + .5 + 0 + .5) / 4 = .5
    assert stats["win_rate"] == pytest.approx(2.7 / 8)
    assert stats["win_rate_with_hint"] == pytest.approx(0.5)
    # the share of plays with return > 0: 4 of 8, with the hint 3 of 4
    assert stats["positive_share"] == pytest.approx(4 / 8)
    assert stats["positive_share_with_hint"] == pytest.approx(3 / 4)
    # variance: mean of squares (.25 + 1 + 1 + .04) / 8 = .28625 minus .3375 ** 2
    assert stats["return_variance"] == pytest.approx(0.28625 - 0.3375 ** 2)
    assert stats["regret_at_gen"] == pytest.approx(0.5 - 0.125)  # step 2 only
    assert (stats["n_plays_at_gen"], stats["n_hint_plays_at_gen"]) == (4, 4)
    assert stats["n_failures"] == 1 and (stats["first_step"], stats["last_step"]) == (2, 3)
    early = store.env_stats(p.sha256, until_step=2)
    assert early["win_rate"] == pytest.approx(0.125) and early["n_plays"] == 4
    assert early["positive_share"] == pytest.approx(0.25)
    q = program(2)
    store.add_environment(q, step=5)
    fresh = store.env_stats(q.sha256)
    assert fresh["n_plays"] == 0 and fresh["win_rate"] is None and fresh["regret_at_gen"] is None
    assert set(store.all_env_stats()) == {p.sha256, q.sha256}
    assert set(store.all_env_stats("pooled")) == {p.sha256, q.sha256}
    with pytest.raises(StoreError):  # foreign key: unknown environment
        store.record_play("e" * 64, 1, with_hint=False, episode_return=1.0)
    with pytest.raises(StoreError):
        store.record_play(p.sha256, 1, with_hint=False, episode_return=math.nan)
    with pytest.raises(StoreError):
        store.record_plays([dict(env_sha=p.sha256, step=1, with_hint=False, episode_return=1,
                                 bogus=1)])


def test_episode_round_trip(store):
    p = program(1)
    store.add_environment(p, step=1)
    ep = {"program_sha256": p.sha256, "seed": 7, "hint": "h", "tag": {"with_hint": True},
          "token_ids": [1, 2, 3, 50_000, 4], "loss_mask": [0, 0, 1, 1, 0],
          "logprobs": [0.0, 0.0, -0.1234567890123, -2.5, 0.0],
          "messages": [{"role": "user", "content": "hi " * 1000}],
          "turns": [{"action": "\\boxed{1}", "observation": "ok", "reward": 0.5,
                     "terminated": False, "truncated": False, "new_tokens": 2,
                     "finish_reason": "stop", "exact_render": True, "generate_s": 0.25,
                     "step_s": 0.5},
                    {"action": "\\boxed{2}", "observation": "won", "reward": 1.0,
                     "terminated": True, "truncated": False, "new_tokens": 1,
                     "finish_reason": "stop", "exact_render": False, "generate_s": 0.25,
                     "step_s": 0.25}],
          "prompt_len": 2, "terminated": True, "truncated": False, "stop_reason": "terminated",
          "failure": None, "episode_return": 1.0, "num_sampled": 2}
    eid = store.record_episode(ep, step=1)
    back = store.get_episode(eid)
    for key in ("token_ids", "loss_mask", "logprobs", "messages", "seed", "hint", "tag",
                "prompt_len", "stop_reason", "episode_return", "terminated", "truncated"):
        assert back[key] == ep[key], key
    assert back["turns"] == ep["turns"]
    assert back["with_hint"] is True and back["n_sampled"] == 2 and back["n_tokens"] == 5
    assert back["generate_s"] == pytest.approx(0.5) and back["step_s"] == pytest.approx(0.75)
    assert store.episode_ids(p.sha256) == [eid] and store.episode_ids(step=9) == []
    play = store.query("SELECT * FROM plays WHERE episode_id = ?", (eid,))
    assert len(play) == 1 and play[0]["with_hint"] == 1 and play[0]["turns"] == 2
    crashed = dict(ep, failure={"reason": "env_error", "message": "boom"}, episode_return=0.0,
                   tag={}, hint=None, logprobs=None)
    cid = store.record_episode(crashed, step=1)
    assert store.get_episode(cid)["logprobs"] is None
    row = store.query("SELECT * FROM plays WHERE episode_id = ?", (cid,))[0]
    assert (row["failure"], row["with_hint"]) == ("env_error", 0)
    assert pack_array([], "i") and unpack_array(pack_array([], "i")) == []


def test_delay_buffer(store):
    p = program(1)
    store.add_environment(p, step=0)
    for due in (4, 2, 8):
        store.push_delayed({"token_ids": [1, 2, 3], "loss_mask": [0, 1, 1],
                            "logprobs": [0.0, -0.5, -1.25], "skill": "Optimization",
                            "env_sha": p.sha256, "generated_step": due - 4, "due_step": due,
                            "sample_id": f"d{due}", "prompt_len": 1, "meta": {"w": 1.5}})
    store.push_delayed({"token_ids": [9], "loss_mask": [1], "generated_step": 0, "due_step": 4})
    assert store.delayed_count() == 4
    due = store.pop_due(4)
    assert [d["due_step"] for d in due] == [2, 4, 4]
    assert due[0]["token_ids"] == [1, 2, 3] and due[0]["loss_mask"] == [0, 1, 1]
    assert due[0]["logprobs"] == [0.0, -0.5, -1.25] and due[0]["meta"] == {"w": 1.5}
    assert due[2]["logprobs"] is None and due[2]["env_sha"] is None
    assert store.pop_due(4) == [] and store.delayed_count() == 1
    with pytest.raises(StoreError, match="same length"):
        store.push_delayed({"token_ids": [1, 2], "loss_mask": [1], "generated_step": 0,
                            "due_step": 1})


def test_a_queued_designer_sample_can_be_given_a_fixed_reward(store):
    p, q = program(1), program(2)
    for prog in (p, q):
        store.add_environment(prog, step=0)
        store.push_delayed({"token_ids": [1, 2], "loss_mask": [0, 1], "generated_step": 0,
                            "due_step": 4, "env_sha": prog.sha256, "meta": {"reason": "ok"}})
    assert store.fix_delayed_reward(p.sha256, -0.5, "play_timeout") == 1
    assert store.fix_delayed_reward("c" * 64, -0.5, "play_timeout") == 0
    with pytest.raises(StoreError):
        store.fix_delayed_reward(q.sha256, math.nan, "x")
    metas = {d["env_sha"]: d["meta"] for d in store.pop_due(4)}
    assert metas[p.sha256] == {"reason": "play_timeout", "fixed_reward": -0.5}
    assert metas[q.sha256] == {"reason": "ok"}  # untouched, also by the refused NaN
    assert store.fix_delayed_reward(p.sha256, -0.5, "late") == 0  # trained already


def test_blacklist_hints_state_metrics(store):
    p = program(1)
    store.add_environment(p, step=0)
    store.blacklist(p.sha256, "timeout", step=3)
    store.blacklist(p.sha256, "again", step=4)
    store.blacklist("a" * 64, "timeout", step=5)  # never stored as an environment
    assert store.is_blacklisted(p.sha256) and store.is_blacklisted("a" * 64)
    assert not store.is_blacklisted("b" * 64)
    assert store.get_environment(p.sha256)["status"] == "blacklisted"
    assert [(b["reason"], b["step"]) for b in store.blacklisted()][0] == ("timeout", 3)
    assert store.blacklist_reason(p.sha256) == "timeout"  # the first reason is kept
    assert store.blacklist_reason("b" * 64) is None

    assert store.get_hint(p.sha256) is None
    store.put_hint(p.sha256, "think first", "second_call", step=2, meta={"t": 0.3})
    hint = store.get_hint(p.sha256)
    assert (hint["hint"], hint["how"], hint["step"], hint["meta"]) == (
        "think first", "second_call", 2, {"t": 0.3})

    assert store.get_state("ema", "missing") == "missing"
    state = {"fast": 0.5, "slow": [0.1, 0.2], "rng": [3, [1, 2, 3], None], "pos": 17}
    store.put_state("ema", state)
    store.put_state("ema", dict(state, pos=18))
    assert store.get_state("ema") == dict(state, pos=18)
    with pytest.raises(StoreError):
        store.put_state("bad", {"x": object()})
    with pytest.raises(StoreError):
        store.put_state("bad", {"x": math.inf})

    store.log_metrics(1, {"loss": 0.5, "reward": 1})
    store.log_metrics(2, {"loss": 0.25})
    store.log_metrics(1, {"loss": 0.75})  # replaces
    assert store.metrics("loss") == [(1, 0.75), (2, 0.25)]
    assert store.metrics("reward") == [(1, 1.0)] and store.metric_names() == ["loss", "reward"]
    with pytest.raises(StoreError):
        store.log_metrics(3, {"loss": math.nan})


def read_events(store: RunStore) -> list[dict]:
    if not store.events_path.exists():
        return []
    return [json.loads(line) for line in store.events_path.read_text().splitlines()]


def test_events_jsonl(store):
    store.append_event({"kind": "start", "config": {"a": 1}})
    assert [e["kind"] for e in read_events(store)] == ["start"]
    with store.round(1):
        store.append_event({"type": "round", "n": 1})
        assert len(read_events(store)) == 1  # written only once the round commits
    events = read_events(store)
    assert [e.get("kind", e.get("type")) for e in events] == ["start", "round"]
    assert events[1]["step"] == 1 and events[1]["n"] == 1
    with pytest.raises(RuntimeError):
        with store.round(2):
            store.append_event({"kind": "lost"})
            raise RuntimeError("crash")
    assert len(read_events(store)) == 2
    assert [e["kind"] for e in store.events()] == ["start", "round"]
    assert store.events("round")[0]["data"] == {"type": "round", "n": 1}


def test_round_exception_leaves_nothing(store):
    p, q = program(1), program(2)
    store.push_delayed({"token_ids": [1], "loss_mask": [1], "generated_step": 0, "due_step": 1})
    with store.round(1):
        store.add_environment(p, step=1)
        store.record_play(p.sha256, 1, with_hint=False, episode_return=1.0)
        store.put_state("counter", 1)
        store.record_checkpoint(1, meta={"tokens": 10})
    assert store.latest_complete_step() == 1
    assert store.latest_checkpoint()["path"] == store.checkpoint_dir(1)
    before = {t: store.query(f"SELECT COUNT(*) FROM {t}")[0][0] for t in TABLES}

    def writer_thread():
        store.log_metrics(2, {"from_thread": 1.0})

    with pytest.raises(ValueError, match="boom"):
        with store.round(2):
            assert store.current_round == 2
            store.add_environment(q, step=2)
            store.record_plays([dict(env_sha=p.sha256, step=2, with_hint=True,
                                     episode_return=0.5)] * 3)
            store.set_status(p.sha256, "retired", step=2)
            store.put_state("counter", 2)
            assert len(store.pop_due(2)) == 1
            store.blacklist("c" * 64, "timeout", 2)
            store.put_hint(q.sha256, "h", "designer")
            t = threading.Thread(target=writer_thread)
            t.start()
            t.join()
            store.record_checkpoint(2)
            raise ValueError("boom")
    after = {t: store.query(f"SELECT COUNT(*) FROM {t}")[0][0] for t in TABLES}
    assert after == before
    assert store.current_round is None and store.latest_complete_step() == 1
    assert store.get_state("counter") == 1 and store.delayed_count() == 1
    assert store.get_environment(p.sha256)["status"] == "pooled"
    assert not store.has_environment(q.sha256) and not store.is_blacklisted("c" * 64)
    assert store.latest_checkpoint()["step"] == 1 and store.metrics("from_thread") == []
    # an atomic block failing inside a round undoes only itself (savepoint)
    with store.round(2):
        store.put_state("counter", 2)
        with pytest.raises(KeyError):
            with store.transaction():
                store.put_state("counter", 99)
                raise KeyError("inner")
        assert store.get_state("counter") == 2
    assert store.completed_rounds() == [1, 2] and store.get_state("counter") == 2
    with pytest.raises(StoreError, match="not after"):
        with store.round(2):
            pass
    with pytest.raises(StoreError, match="inside another round"):
        with store.round(3):
            with store.round(4):
                pass
    assert store.latest_complete_step() == 2


def test_checkpoint_dir(store):
    assert store.latest_checkpoint() is None and store.latest_complete_step() is None
    path = store.checkpoint_dir(5)
    assert path == store.run_dir / "checkpoints" / "step-5" and not path.exists()
    assert store.checkpoint_dir(5, create=True).is_dir()
    with store.round(5):
        store.record_checkpoint(5, path, meta={"optimizer": True})
    assert store.latest_checkpoint() == {"step": 5, "path": path, "meta": {"optimizer": True}}
    assert store.query("SELECT path FROM checkpoints")[0][0] == "checkpoints/step-5"


KILLED_WRITER = r"""
import os, sys, time
from spadekit.envs.program import EnvProgram
from spadekit.runs.store import RunStore

store = RunStore(sys.argv[1], create=True)
def prog(i):
    return EnvProgram(code=f"class K{i}Env:\n    pass\n# " + os.urandom(150_000).hex() + "\n")
with store.round(1):
    first = prog(0)
    store.add_environment(first, step=1)
    store.record_play(first.sha256, 1, with_hint=False, episode_return=1.0)
    store.put_state("round", 1)
    store.append_event({"kind": "round_done", "n": 1})
with store.round(2):
    for i in range(1, 25):  # ~7 MB: more than the page cache, so pages spill into the WAL
        p = prog(i)
        store.add_environment(p, step=2)
        store.record_plays([dict(env_sha=p.sha256, step=2, with_hint=False,
                                 episode_return=0.5)] * 20)
    store.put_state("round", 2)
    store.append_event({"kind": "round_done", "n": 2})
    print("IN_ROUND", flush=True)
    time.sleep(60)
"""


def test_sigkill_inside_round_keeps_previous_round(tmp_path):
    run = tmp_path / "run"
    env = dict(os.environ, PYTHONPATH=str(SRC) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.Popen([sys.executable, "-c", KILLED_WRITER, str(run)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()
        assert line.strip() == "IN_ROUND", proc.stderr.read()
        wal = run / "run.sqlite-wal"
        assert wal.stat().st_size > 1_000_000  # uncommitted round-2 pages are on disk
        os.kill(proc.pid, signal.SIGKILL)
        assert proc.wait(timeout=10) == -signal.SIGKILL
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stdout.close()
        proc.stderr.close()
    with RunStore.open(run, verify=True) as store:
        assert store.integrity_check() == ["ok"]
        assert store.latest_complete_step() == 1 and store.get_state("round") == 1
        assert len(store.environments()) == 1
        assert store.query("SELECT COUNT(*) FROM plays")[0][0] == 1
        assert [e["n"] for e in read_events(store)] == [1]
        with store.round(2):  # the lost round can be redone
            store.put_state("round", 2)
        assert store.latest_complete_step() == 2


def test_corrupt_files(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "run.sqlite").write_bytes(b"this is not a database at all" * 100)
    with pytest.raises(StoreCorruptError, match="run.sqlite") as info:
        RunStore.open(run)
    assert info.value.path == str(run / "run.sqlite") and isinstance(info.value, StoreError)

    good = tmp_path / "good"
    with RunStore(good, create=True) as s:
        for i in range(50):
            s.add_environment(program(i))
    data = bytearray((good / "run.sqlite").read_bytes())
    data[4096:] = os.urandom(len(data) - 4096)  # keep the header page, garble the rest
    (good / "run.sqlite").write_bytes(bytes(data))
    with pytest.raises(StoreCorruptError, match="run.sqlite"):
        with RunStore.open(good, verify=True) as s:
            s.environments()


def test_schema_version_checks(tmp_path):
    run = tmp_path / "run"
    RunStore(run, create=True).close()
    con = sqlite3.connect(run / "run.sqlite")
    con.execute("INSERT INTO schema_version VALUES (99, 0, 'future')")
    con.commit()
    con.close()
    with pytest.raises(SchemaVersionError, match="99") as info:
        RunStore.open(run)
    assert (info.value.found, info.value.supported) == (99, SCHEMA_VERSION)

    other = tmp_path / "other"
    other.mkdir()
    con = sqlite3.connect(other / "run.sqlite")
    con.execute("CREATE TABLE stuff (x)")
    con.commit()
    con.close()
    with pytest.raises(StoreError, match="not a spadekit run"):
        RunStore.open(other)


def test_a_version_1_run_is_migrated_and_keeps_rejected_outputs(tmp_path):
    import sqlite3

    run = tmp_path / "old"
    with RunStore(run, create=True) as s:
        s.put_state("kept", 7)
    con = sqlite3.connect(run / "run.sqlite")  # turn it back into a version-1 database
    con.execute("DROP TABLE rejected")
    con.execute("DROP TABLE rollout_queue")
    con.execute("DROP TABLE token_ledger")
    con.execute("DELETE FROM schema_version WHERE version >= 2")
    con.commit()
    con.close()
    with RunStore.open(run) as s:
        assert s.schema_version == 3 and s.get_state("kept") == 7
        assert s.ledger() == [] and s.queued() == []
        rid = s.record_rejected(step=3, skill="Logical_Deduction", stage="load",
                                reason="no_env_class", message="no class ends in Env",
                                text="```python\nprint('<script>')\n```", details={"n": 1})
        (row,) = s.rejected()
        assert row["id"] == rid and row["text"].startswith("```python")
        assert row["details"] == {"n": 1} and row["stage"] == "load"
        assert s.rejected("other") == []


def test_win_rate_is_clipped_and_blacklisted_codes_are_found(store):
    p = program(7)
    store.add_environment(p, step=0)
    for r in (1.5, 1.0):  # a program paying over 1: the win rate stays in [0, 1]
        store.record_play(p.sha256, 0, with_hint=False, episode_return=r)
    stats = store.env_stats(p.sha256)
    assert stats["win_rate"] == 1.0 and stats["mean_return"] == pytest.approx(1.25)
    assert stats["return_variance"] == pytest.approx(0.0625)
    # blacklisted: a stored environment (its code), a rejected output (the program in it),
    # and one whose code is nowhere (left out)
    hang = program(8)
    store.blacklist(p.sha256, "garbage_wins", 1)
    store.blacklist(hang.sha256, "timeout", 1)
    store.record_rejected(step=1, skill="s", stage="interface", reason="timeout",
                          sha256=hang.sha256, text=f"```python\n{hang.code}\n```")
    store.blacklist("f" * 64, "timeout", 1)
    found = {sha: (reason, code) for sha, reason, code in store.blacklisted_codes()}
    assert found == {p.sha256: ("garbage_wins", p.code), hang.sha256: ("timeout", hang.code)}


@pytest.mark.parametrize(("given", "expected"), [("mean_return", 0.075),
                                                 ("positive_share", 0.5)])
def test_the_memory_s_win_rate_is_the_plateau_s(store, given, expected):
    """A lottery's plays (0.15 on half the seeds): the memory records the number the plateau
    judges, so a positive seed (band [0.15, 0.85]) is only what the plateau would reward."""
    from spadekit.selfplay.memory import EnvironmentMemory

    memory = EnvironmentMemory(store, win_rate_input=given)
    p = program(9)
    store.add_environment(p, step=0)
    memory.add(p, step=0)
    for r in (0.15, 0.0) * 4:  # mean 0.075 (< 0.1: too hard), share 0.5 (a positive seed)
        store.record_play(p.sha256, 0, with_hint=False, episode_return=r)
    record = memory.refresh_from_store(p.sha256)
    assert record.win_rate == pytest.approx(expected)
    assert (memory.positive_seeds(p.skill, 2) != []) is (given == "positive_share")
    negative = memory.negative_seed(p.skill)
    assert (negative[1] if negative else None) == ("too hard" if given == "mean_return" else None)
