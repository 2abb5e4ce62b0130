"""Faults injected into a real run (issue 25, item 4): SIGTERM mid-round, the database locked by
another process, a full disk while the database or a checkpoint is written, SIGKILL at named
points of the round. Each ends in a clean exit or a typed error, with every committed round
intact and a resume that goes on.

The runs are ``benchmarks/chaos.py``'s: the tiny model (it really trains), a designer that
answers each prompt with one of three real programs, real sandboxes, a real run database.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

import chaos  # noqa: E402

SRC = str(ROOT / "src")


def _cli(run: Path, rounds: int, *extra: str) -> subprocess.Popen:
    sets = ["rollout.max_new_tokens=4", "designer.max_new_tokens=16", "envs_per_round=1",
            "bootstrap_per_round=1", "num_generations=2", "hint_generations=1",
            "tensorboard=false"]
    cmd = [sys.executable, "-m", "spadekit", "selfplay", "--model", "tiny", "--rounds",
           str(rounds), *sum((["--set", s] for s in sets), []), *extra]
    cmd += ["--resume", str(run)] if (run / "run.sqlite").exists() else ["--run-dir", str(run)]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": SRC, "COLUMNS": "200"})


def _committed(run: Path) -> int | None:
    from spadekit.runs.store import RunStore

    with RunStore.open(run) as store:
        return store.latest_complete_step()


def test_sigterm_rolls_the_round_back_and_exits_0_with_the_resume_line(tmp_path):
    run = tmp_path / "run"
    proc = _cli(run, 3)
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:  # round 0's table is printed after its commit
        line = proc.stdout.readline()
        if not line or "round 0 (" in line:
            break
    assert proc.poll() is None, proc.stderr.read()
    time.sleep(1.0)  # inside round 1 (its design takes longer than this)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err
    assert "stopped by SIGTERM" in err and f"--resume {run}" in err
    assert "Traceback" not in err
    assert _committed(run) in (0, 1)  # round 1 rolled back, or committed just before
    last = _committed(run)
    proc = _cli(run, 1)
    out, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, err
    assert _committed(run) == last + 1


def test_a_database_locked_by_another_process_is_a_typed_error_and_nothing_is_lost(tmp_path):
    run = tmp_path / "run"
    assert chaos.run_through(run, 1)["rc"] == 0
    before = chaos.completed(run)
    holder = subprocess.Popen([sys.executable, "-c", (
        "import sqlite3, sys, time\n"
        f"c = sqlite3.connect({str(run / 'run.sqlite')!r}, isolation_level=None)\n"
        "c.execute('BEGIN EXCLUSIVE')\nprint('locked', flush=True)\ntime.sleep(120)\n")],
        stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        result = chaos.run_through(run, 2)
    finally:
        holder.kill()
        holder.wait()
    assert result["rc"] not in (0, -signal.SIGKILL)
    assert "StoreError" in result["stderr"] and "locked" in result["stderr"]
    assert chaos.completed(run) == before
    assert chaos.run_through(run, 2)["rc"] == 0  # once the lock is gone the run goes on
    assert chaos.completed(run) == 2


@pytest.mark.parametrize("point", ["1:play", "1:update", "1:save:weights", "1:commit",
                                   "1:committed"])
def test_sigkill_at_a_point_keeps_every_committed_round(tmp_path, point):
    run = tmp_path / "run"
    result = chaos.run_through(run, 3, fault=point)
    assert result["killed"], result["stderr"]
    assert chaos.completed(run) == (2 if point == "1:committed" else 1)
    leftovers = [p.name for p in (run / "checkpoints").iterdir() if ".tmp-" in p.name]
    assert chaos.run_through(run, 3)["rc"] == 0
    assert chaos.completed(run) == 3
    assert not [p.name for p in (run / "checkpoints").iterdir() if ".tmp-" in p.name], \
        leftovers  # a temp dir a killed save left is swept by the next save


UNSHARE = (["unshare", "--mount"] if os.geteuid() == 0
           else ["unshare", "--user", "--map-root-user", "--mount"])
"""A private mount namespace (as root; else inside a user namespace) for a small tmpfs."""


def _tmpfs_available() -> bool:
    if shutil.which("unshare") is None:
        return False
    probe = subprocess.run([*UNSHARE, "sh", "-c",
                            "mount -t tmpfs -o size=1m tmpfs /mnt && echo ok"],
                           capture_output=True, text=True)
    return probe.stdout.strip() == "ok"


@pytest.mark.skipif(not _tmpfs_available(), reason="no user namespace to mount a small tmpfs")
def test_a_full_disk_is_a_typed_error_and_the_previous_round_is_intact(tmp_path):
    """The run directory on a small tmpfs (a mount namespace) with about 700 KB left: the
    checkpoints fill it within a few rounds; the round that hits ENOSPC fails with a typed error, the committed
    rounds stay readable, and after space is freed the run resumes."""
    script = tmp_path / "full.sh"
    script.write_text(
        "set -e\nmount -t tmpfs -o size=16m tmpfs /mnt\n"
        f"cp -r {tmp_path / 'seed'} /mnt/run\n"
        # leave about 1.5 checkpoints of room: the disk fills a round or two later
        "avail=$(df --output=avail -k /mnt | tail -1)\n"
        "dd if=/dev/zero of=/mnt/filler bs=1k count=$((avail - 700)) 2>/dev/null\n"
        f"{sys.executable} {ROOT / 'benchmarks' / 'chaos.py'} --child /mnt/run --rounds 12 "
        "--set checkpoint.keep_last=100 > /mnt/out.txt 2> /mnt/err.txt || echo rc=$? >> /mnt/out.txt\n"
        f"{sys.executable} -c \"import sys; sys.path.insert(0, '{SRC}'); "
        "from spadekit.runs.store import RunStore; s = RunStore.open('/mnt/run'); "
        "print('committed', s.latest_complete_step()); s.close()\" >> /mnt/out.txt\n"
        "rm /mnt/filler\n"  # space freed: the run goes on from its last commit
        f"{sys.executable} {ROOT / 'benchmarks' / 'chaos.py'} --child /mnt/run --rounds 4 "
        "--set checkpoint.keep_last=100 > /mnt/after.txt 2>&1 || echo rc=$? >> /mnt/after.txt\n"
        f"cp /mnt/out.txt /mnt/err.txt /mnt/after.txt {tmp_path}/\n")
    seed = tmp_path / "seed"
    assert chaos.run_through(seed, 1)["rc"] == 0  # round 0 outside, so only the rounds fill
    proc = subprocess.run([*UNSHARE, "bash", str(script)], capture_output=True, text=True, timeout=900,
                          env={**os.environ, "PYTHONPATH": SRC})
    assert proc.returncode == 0, proc.stderr
    out = (tmp_path / "out.txt").read_text()
    err = (tmp_path / "err.txt").read_text()
    assert "rc=" in out, out  # the disk filled before 12 rounds
    assert "No space left" in err or "disk is full" in err, err[-2000:]
    # typed: the checkpoint write or the database commit, never a bare library error
    assert "CheckpointWriteError" in err or "StoreError" in err, err[-2000:]
    committed = int(out.split("committed")[-1].split()[0])
    assert committed >= 1  # the rounds before it are intact and readable
    after = (tmp_path / "after.txt").read_text()
    assert "rc=" not in after and '{"done": 3}' in after, after[-2000:]


def test_a_run_killed_ten_times_equals_the_run_never_killed(tmp_path):
    """Resume equivalence (issue 25, item 2): two uninterrupted runs of the seeded config
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
