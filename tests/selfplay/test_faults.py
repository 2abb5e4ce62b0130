"""Faults injected into a real run: SIGTERM mid-round, the database locked by
another process, a full disk while the database or a checkpoint is written, a damaged latest
checkpoint, SIGKILL at named points of the round, and ten kills compared with a run never
killed. Each ends in a clean exit or a typed error, with every committed round intact and a
resume that goes on.

The scenarios are ``benchmarks/chaos_faults.py``'s (``benchmarks/chaos.py`` runs the same):
the tiny model (it really trains), a designer that answers each prompt with a real program drawn
from its hash, real sandboxes, a real run database, the real CLI for SIGTERM.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

import chaos  # noqa: E402
import chaos_faults  # noqa: E402
import prefork  # noqa: E402

chaos.POPEN = prefork.popen  # the run's processes fork from preloaded interpreters


def test_sigterm_rolls_the_round_back_and_exits_0_with_the_resume_line(tmp_path):
    r = chaos_faults.sigterm(tmp_path)
    assert r["alive_before_signal"] and r["rc"] == 0, r["stderr"]
    assert "stopped by SIGTERM" in r["stderr"] and "--resume" in r["stderr"]
    assert "Traceback" not in r["stderr"]
    assert r["committed_after"] in (0, 1)  # round 1 rolled back, or committed just before
    assert r["resume_rc"] == 0 and r["committed_after_resume"] == r["committed_after"] + 1
    assert r["survived"]


def test_a_database_locked_by_another_process_is_a_typed_error_and_nothing_is_lost(tmp_path):
    r = chaos_faults.locked_database(tmp_path)
    assert r["rc"] != 0 and "StoreError" in r["stderr"] and "locked" in r["stderr"], r
    assert r["committed_during"] == r["committed_before"] == 1
    assert r["committed_after"] == 2  # once the lock is gone the run goes on
    assert r["survived"]


@pytest.mark.parametrize("point", ["1:play", "1:update", "1:save:weights", "1:commit",
                                   "1:committed"])
def test_sigkill_at_a_point_keeps_every_committed_round(tmp_path, point):
    r = chaos_faults.sigkill_at(tmp_path, point)
    assert r["killed"] and r["committed"] == (2 if point == "1:committed" else 1), r
    assert r["resume_rc"] == 0 and r["completed"] == 3
    assert not r["leftover_temps"]  # a temp dir a killed save left is swept by the next save
    assert r["survived"]


def test_a_damaged_latest_checkpoint_is_survived_through_the_fallback(tmp_path):
    r = chaos_faults.damaged_checkpoint(tmp_path)
    assert r["rc"] == 0 and r["events"] == 1 and r["lost_rounds"] == [2, 2], r
    assert r["committed"] == 4 and r["survived"]


@pytest.mark.skipif(not chaos_faults.tmpfs_available(),
                    reason="no mount namespace to mount a small tmpfs")
def test_a_full_disk_is_a_typed_error_and_the_previous_round_is_intact(tmp_path):
    r = chaos_faults.full_disk(tmp_path)
    assert r["filled"], r  # the disk filled before 12 rounds
    assert r["enospc"], r["stderr"]
    assert r["typed"], r["stderr"]  # the checkpoint write or the commit, never a bare error
    assert r["committed"] >= 1  # the rounds before it are intact and readable
    assert '{"done": 3}' in r["after"] and "rc=" not in r["after"], r["after"]
    assert r["survived"]


@pytest.mark.timeout(900)  # 14 processes: about 180 s alone on 2 cores, 300 s beside another
def test_a_run_killed_ten_times_equals_the_run_never_killed(tmp_path):
    """Resume equivalence: two uninterrupted runs of the seeded config
    compare equal first (else "equal" would prove nothing); then the same run is killed with
    SIGKILL at ten named points over rounds 1-3 (play, update, inside the checkpoint write,
    before the commit, before design, validation and hints, reward, weight sync, retirement)
    and resumed after each: weights bitwise, every metric per round but the wall-clock ones,
    environments, plays, episodes with their tokens, memory, delay buffer, blacklist, hint
    cache and the loop's random stream are the same."""
    from spadekit.runs.fingerprint import differences, fingerprint

    rounds = 4
    for name in ("a", "b"):
        assert chaos.run_through(tmp_path / name, rounds)["rc"] == 0
    ref = fingerprint(tmp_path / "a")
    assert differences(ref, fingerprint(tmp_path / "b")) == []
    assert ref["weights"] and len(ref["rounds"]) == rounds and ref["delay_buffer"]
    plan = chaos.kill_plan(rounds, 10)
    assert len(plan) == 10
    log = chaos.killed_run(tmp_path / "killed", rounds, plan)
    killed = [x["what"] for x in log if x.get("killed")]
    assert killed == [what for _kind, what in plan], log  # every point was reached and killed
    got = fingerprint(tmp_path / "killed")
    assert differences(ref, got) == []
    assert got["weights"] == ref["weights"]
