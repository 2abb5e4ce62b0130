"""The faults ``benchmarks/chaos.py`` injects into a real run, one function each (issue 25,
item 4), shared with ``tests/selfplay/test_faults.py``.

Each function runs its scenario in ``folder`` and returns a dict with ``fault`` (its name),
``survived`` (the run ended in a clean exit or a typed error, every committed round was intact,
and a resume went on) and the evidence the tests assert on. A scenario that cannot run on this
machine (no mount namespace for a small tmpfs) returns ``{"skipped": reason}``.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import chaos

ROOT = Path(__file__).resolve().parents[1]
SRC = str(ROOT / "src")

UNSHARE = (["unshare", "--mount"] if os.geteuid() == 0
           else ["unshare", "--user", "--map-root-user", "--mount"])
"""A private mount namespace (as root; else inside a user namespace) for a small tmpfs."""


def cli(run: Path, rounds: int, *extra: str) -> subprocess.Popen:
    """``spadekit selfplay --preset cpu-tiny`` on the tiny model (the real CLI), new or
    resumed."""
    sets = ["rollout.max_new_tokens=4", "designer.max_new_tokens=16", "envs_per_round=1",
            "bootstrap_per_round=1", "num_generations=2", "hint_generations=1",
            "tensorboard=false"]
    # cpu-tiny, not the default cpu-kit: its second hint call keeps round 1 longer than the
    # one second sigterm() waits before signalling
    cmd = [sys.executable, "-m", "spadekit", "selfplay", "--preset", "cpu-tiny", "--model",
           "tiny", "--rounds", str(rounds), *sum((["--set", s] for s in sets), []), *extra]
    cmd += ["--resume", str(run)] if (run / "run.sqlite").exists() else ["--run-dir", str(run)]
    return chaos.POPEN(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                       env={**os.environ, "PYTHONPATH": SRC, "COLUMNS": "200"})


def sigterm(folder: Path) -> dict:
    """SIGTERM inside round 1 of the CLI: exit 0, the resume line, round 1 rolled back (or
    committed just before), then a resume completes one more round."""
    run = folder / "run"
    proc = cli(run, 3)
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:  # round 0's table is printed after its commit
        line = proc.stdout.readline()
        if not line or "round 0 (" in line:
            break
    alive = proc.poll() is None
    time.sleep(1.0)  # inside round 1 (its design takes longer than this)
    proc.send_signal(signal.SIGTERM)
    _out, err = proc.communicate(timeout=300)
    last = chaos.completed(run) - 1
    resumed = cli(run, 1)
    _o, err2 = resumed.communicate(timeout=600)
    result = {"fault": "sigterm", "rc": proc.returncode, "stderr": err[-3000:],
              "committed_after": last, "alive_before_signal": alive,
              "resume_rc": resumed.returncode, "committed_after_resume":
              chaos.completed(run) - 1, "resume_stderr": err2[-2000:]}
    result["survived"] = (alive and proc.returncode == 0 and "stopped by SIGTERM" in err
                          and f"--resume {run}" in err and "Traceback" not in err
                          and last in (0, 1) and resumed.returncode == 0
                          and result["committed_after_resume"] == last + 1)
    return result


def locked_database(folder: Path) -> dict:
    """Another process holds the database's write lock: the round fails with ``StoreError``,
    nothing is lost, and once the lock is gone the run goes on."""
    run = folder / "run"
    first = chaos.run_through(run, 1)
    before = chaos.completed(run)
    holder = subprocess.Popen([sys.executable, "-c", (
        "import sqlite3, sys, time\n"
        f"c = sqlite3.connect({str(run / 'run.sqlite')!r}, isolation_level=None)\n"
        "c.execute('BEGIN EXCLUSIVE')\nprint('locked', flush=True)\ntime.sleep(120)\n")],
        stdout=subprocess.PIPE, text=True)
    try:
        locked = holder.stdout.readline().strip() == "locked"
        result = chaos.run_through(run, 2)
    finally:
        holder.kill()
        holder.wait()
    during = chaos.completed(run)
    after = chaos.run_through(run, 2)
    out = {"fault": "locked_database", "rc": result["rc"], "stderr": result["stderr"],
           "committed_before": before, "committed_during": during,
           "committed_after": chaos.completed(run)}
    out["survived"] = (first["rc"] == 0 and locked and result["rc"] not in (0, -signal.SIGKILL)
                       and "StoreError" in result["stderr"] and "locked" in result["stderr"]
                       and during == before and after["rc"] == 0
                       and out["committed_after"] == 2)
    return out


def tmpfs_available() -> bool:
    if shutil.which("unshare") is None:
        return False
    probe = subprocess.run([*UNSHARE, "sh", "-c",
                            "mount -t tmpfs -o size=1m tmpfs /mnt && echo ok"],
                           capture_output=True, text=True)
    return probe.stdout.strip() == "ok"


def full_disk(folder: Path) -> dict:
    """The run directory on a small tmpfs with about 700 KB left: the round that hits ENOSPC
    fails with a typed error, the committed rounds stay readable, and once space is freed the
    run goes on."""
    if not tmpfs_available():
        return {"fault": "full_disk", "skipped": "no mount namespace for a small tmpfs"}
    seed = folder / "seed"
    chaos.run_through(seed, 1)  # round 0 outside, so only the later rounds fill the disk
    child = f"{sys.executable} {ROOT / 'benchmarks' / 'chaos.py'} --child /mnt/run"
    script = folder / "full.sh"
    script.write_text(
        "set -e\nmount -t tmpfs -o size=16m tmpfs /mnt\n"
        f"cp -r {seed} /mnt/run\n"
        "avail=$(df --output=avail -k /mnt | tail -1)\n"
        "dd if=/dev/zero of=/mnt/filler bs=1k count=$((avail - 700)) 2>/dev/null\n"
        f"{child} --rounds 12 --set checkpoint.keep_last=100 > /mnt/out.txt 2> /mnt/err.txt"
        " || echo rc=$? >> /mnt/out.txt\n"
        f"{sys.executable} -c \"import sys; sys.path.insert(0, '{SRC}'); "
        "from spadekit.runs.store import RunStore; s = RunStore.open('/mnt/run'); "
        "print('committed', s.latest_complete_step()); s.close()\" >> /mnt/out.txt\n"
        "rm /mnt/filler\n"  # space freed: the run goes on from its last commit
        f"{child} --rounds 4 --set checkpoint.keep_last=100 > /mnt/after.txt 2>&1"
        " || echo rc=$? >> /mnt/after.txt\n"
        f"cp /mnt/out.txt /mnt/err.txt /mnt/after.txt {folder}/\n")
    proc = subprocess.run([*UNSHARE, "bash", str(script)], capture_output=True, text=True,
                          timeout=900, env={**os.environ, "PYTHONPATH": SRC})
    if proc.returncode != 0:
        return {"fault": "full_disk", "survived": False, "stderr": proc.stderr[-2000:]}
    out, err = (folder / "out.txt").read_text(), (folder / "err.txt").read_text()
    after = (folder / "after.txt").read_text()
    committed = int(out.split("committed")[-1].split()[0])
    result = {"fault": "full_disk", "stderr": err[-3000:], "committed": committed,
              "filled": "rc=" in out, "after": after[-2000:],
              "enospc": "No space left" in err or "disk is full" in err,
              "typed": "CheckpointWriteError" in err or "StoreError" in err}
    result["survived"] = (result["filled"] and result["enospc"] and result["typed"]
                          and committed >= 1 and "rc=" not in after
                          and '{"done": 3}' in after)
    return result


def damaged_checkpoint(folder: Path) -> dict:
    """The newest checkpoint's weights are overwritten with junk: the resume falls back to the
    previous one with a ``checkpoint_fallback`` event and completes."""
    from spadekit.runs.store import RunStore

    run = folder / "run"
    first = chaos.run_through(run, 3)
    for weights in (run / "checkpoints" / "step-2").rglob("*.safetensors"):
        weights.write_bytes(b"junk")
    resumed = chaos.run_through(run, 4)
    with RunStore.open(run) as store:
        events = store.events("checkpoint_fallback")
    result = {"fault": "damaged_checkpoint", "rc": resumed["rc"], "events": len(events),
              "lost_rounds": events[0]["data"]["lost_rounds"] if events else None,
              "committed": chaos.completed(run)}
    result["survived"] = (first["rc"] == 0 and resumed["rc"] == 0 and len(events) == 1
                          and result["lost_rounds"] == [2, 2] and result["committed"] == 4)
    return result


def sigkill_at(folder: Path, point: str) -> dict:
    """SIGKILL at a named point of round 1: every committed round is kept, the temp dir a
    killed save left is swept, and a resume completes the run."""
    run = folder / "run"
    result = chaos.run_through(run, 3, fault=point)
    kept = chaos.completed(run)
    resumed = chaos.run_through(run, 3)
    temps = [p.name for p in (run / "checkpoints").iterdir() if ".tmp-" in p.name]
    out = {"fault": f"sigkill:{point}", "killed": result["killed"], "committed": kept,
           "resume_rc": resumed["rc"], "leftover_temps": temps,
           "completed": chaos.completed(run)}
    out["survived"] = (result["killed"] and kept == (2 if point.endswith(":committed") else 1)
                       and resumed["rc"] == 0 and out["completed"] == 3 and not temps)
    return out


SCENARIOS = {"sigterm": sigterm, "locked_database": locked_database, "full_disk": full_disk,
             "damaged_checkpoint": damaged_checkpoint}
"""The faults ``chaos.py`` runs (SIGKILL at named points is its equivalence phase)."""
