"""Nothing spadekit starts outlives it (issue 25): a trainer process SIGKILLed during play,
while its sandbox workers are idle-stopped (SIGSTOP), or with the Ray env backend, leaves no
process behind (no sandbox: bwrap, its children, the standard-tier worker; nothing of the
local Ray instance it started: GCS, raylet, agents, workers, the env actors' sandboxes).
And a Ray env worker SIGKILLed mid-round fails its own episodes with a typed ``WorkerDied``
naming it, the round and the one before stay intact, and a resume continues.

Each child (``orphan_child.py``) runs real play on real sandboxes. Before the kill the test
records every descendant of the child (pid and start time, so a reused pid is never taken for
one of them); after it, within ``GONE_S``, none may remain, and no process anywhere may carry
the child's marks: the runtime directory of a sandbox owner (``spadekit-rt-PID-``) in its
command line, or the child's Ray session directory (``session_..._PID``) in its command line
or open files (Ray's agents rename themselves, so their command line says nothing).
"""

from __future__ import annotations

import json
import os
import queue
import re
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from conftest import TIERS

import spadekit
from spadekit.rollout.ray_reaper import Follower
from spadekit.runs.fingerprint import WALL_CLOCK_METRICS

SRC = str(Path(spadekit.__file__).resolve().parents[1])
CHILD = str(Path(__file__).with_name("orphan_child.py"))
GONE_S = 30.0
"""How long the killed child's processes may take to go (today's code: Ray's agents never
went)."""
START_S = 300.0
"""How long a child may take to get ready (Ray's start on a busy machine)."""

pytestmark = pytest.mark.skipif(not TIERS, reason="no safe sandbox tier works on this machine")


# -- processes -------------------------------------------------------------------------------

def _stat(pid: int) -> tuple[str, int, int] | None:
    """(state, ppid, start time) of ``pid``, or None if it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            stat = fh.read()
    except OSError:
        return None
    fields = stat[stat.rindex(b")") + 2:].split()
    return fields[0].decode(), int(fields[1]), int(fields[19])


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            return fh.read(4096).replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return ""


def _running(pid: int, start: int) -> bool:
    """Whether ``pid`` is still the process that started at ``start`` and not a zombie."""
    st = _stat(pid)
    return st is not None and st[2] == start and st[0] not in ("Z", "X")


def tree(pid: int) -> dict[int, int]:
    """Every descendant of ``pid`` as ``{pid: start time}`` (by parent links, all of /proc)."""
    kids: dict[int, list[int]] = {}
    starts: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            st = _stat(int(entry))
            if st is not None:
                kids.setdefault(st[1], []).append(int(entry))
                starts[int(entry)] = st[2]
    out: dict[int, int] = {}
    todo = [pid]
    while todo:
        for child in kids.get(todo.pop(), []):
            if child not in out:
                out[child] = starts[child]
                todo.append(child)
    return out


def marked(owners: set[int], driver: int) -> dict[int, str]:
    """Processes that carry the marks of ``owners`` (sandbox runtime directories) or of
    ``driver``'s Ray session, as ``{pid: command line}`` (zombies left out)."""
    rt = re.compile(r"spadekit-rt-(%s)-" % "|".join(str(o) for o in sorted(owners)))
    session = re.compile(r"/session_[0-9_-]+_%d(/|\s|$)" % driver)
    found: dict[int, str] = {}
    me = os.getpid()
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == me:
            continue
        pid = int(entry)
        st = _stat(pid)
        if st is None or st[0] in ("Z", "X"):
            continue
        cmd = _cmdline(pid)
        hit = bool(rt.search(cmd) or session.search(cmd))
        if not hit and (cmd.startswith("ray::") or "ray" in cmd):
            try:
                links = [os.readlink(f"/proc/{pid}/fd/{fd}")
                         for fd in os.listdir(f"/proc/{pid}/fd")]
            except OSError:
                links = []
            hit = any(session.search(link + " ") for link in links)
        if hit:
            found[pid] = cmd[:160]
    return found


def survivors(before: dict[int, int], owners: set[int], driver: int) -> dict[int, str]:
    left = {pid: _cmdline(pid)[:160] for pid, start in before.items() if _running(pid, start)}
    left.update(marked(owners, driver))
    return left


def wait_gone(before: dict[int, int], owners: set[int], driver: int,
              seconds: float = GONE_S) -> dict[int, str]:
    """Poll until nothing of the killed child is left; what was left at the end."""
    end = time.monotonic() + seconds
    while True:
        left = survivors(before, owners, driver)
        if not left or time.monotonic() > end:
            return left
        time.sleep(0.25)


def cleanup(before: dict[int, int]) -> None:
    """Kill, by pid and start time, what a failed test left of its own child."""
    for pid, start in before.items():
        if _running(pid, start):
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass


# -- the child -------------------------------------------------------------------------------

class Child:
    """``orphan_child.py`` with its JSON lines read on a thread."""

    def __init__(self, args: list[str], log: Path) -> None:
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(
            p for p in (SRC, os.environ.get("PYTHONPATH", "")) if p)}
        env.pop("SPADEKIT_FAULT", None)
        self.err = open(log, "w")
        self.proc = subprocess.Popen([sys.executable, CHILD, *args], env=env,
                                     stdout=subprocess.PIPE, stderr=self.err, text=True,
                                     start_new_session=True)
        self.lines: queue.Queue = queue.Queue()
        self.log = log
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            if line.startswith("{"):
                self.lines.put(json.loads(line))
        self.lines.put(None)

    def expect(self, key: str, timeout: float = START_S) -> dict:
        end = time.monotonic() + timeout
        while True:
            try:
                msg = self.lines.get(timeout=max(0.1, end - time.monotonic()))
            except queue.Empty:
                msg = None
            if msg is None or time.monotonic() > end:  # (the spawn fixture kills it)
                pytest.fail(f"the child gave no {key!r} line (rc {self.proc.returncode}): "
                            f"{self.log.read_text()[-3000:]}")
            if key in msg:
                return msg

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=60)
        self.err.close()

    def finish(self, timeout: float = START_S) -> int:
        try:
            return self.proc.wait(timeout=timeout)
        finally:
            self.err.close()


@pytest.fixture
def spawn():
    """Starts children; whatever a failed test left of them is killed at the end."""
    started: list[Child] = []

    def start(args: list[str], log: Path) -> Child:
        started.append(Child(args, log))
        return started[-1]

    yield start
    for child in started:
        below = tree(child.proc.pid) if child.proc.poll() is None else {}
        child.kill()
        cleanup(below)


def kill_and_check(child: Child, settle: float = 0.5) -> None:
    """SIGKILL the child mid-whatever-it-does; then nothing of it may remain."""
    time.sleep(settle)
    # stopped first, so that the list of its processes is complete when the kill comes
    os.kill(child.proc.pid, signal.SIGSTOP)
    end = time.monotonic() + 10
    while _stat(child.proc.pid)[0] not in ("T", "t") and time.monotonic() < end:
        time.sleep(0.01)
    before = tree(child.proc.pid)
    owners = {child.proc.pid, *before}
    assert before, "the child had no processes below it"
    try:
        child.kill()
        left = wait_gone(before, owners, child.proc.pid)
        assert not left, (f"{len(left)} processes outlived their SIGKILLed parent by "
                          f"{GONE_S:g}s: {left}")
    finally:
        cleanup(before)


# -- local sandboxes -------------------------------------------------------------------------

@pytest.mark.parametrize("tier", TIERS)
@pytest.mark.parametrize("mode", ["play", "idle", "churn"])
def test_sandboxes_die_with_a_killed_trainer(spawn, tmp_path, tier, mode):
    """``play``: mid-step; ``idle``: every worker stopped (SIGSTOP), so only a signal the
    kernel delivers to stopped processes (SIGKILL) reaches them; ``churn``: workers booting,
    loading, playing and being killed and cleaned up, all at once."""
    child = spawn(["local", tier, mode], tmp_path / "child.log")
    ready = child.expect("ready")
    assert ready["sandboxes"]
    if mode == "idle":
        assert all(_stat(p) is None or _stat(p)[0] in ("T", "t") for p in ready["sandboxes"])
    kill_and_check(child, settle={"play": 0.5, "idle": 0.0, "churn": 1.5}[mode])


# -- Ray -------------------------------------------------------------------------------------

@pytest.mark.extra("ray")
@pytest.mark.parametrize("mode", ["play", "idle"])
def test_a_local_ray_instance_dies_with_its_killed_driver(spawn, tmp_path, mode):
    child = spawn(["ray", TIERS[0], mode], tmp_path / "child.log")
    ready = child.expect("ready")
    names = {_cmdline(p).split(" ")[0].rsplit("/", 1)[-1] for p in tree(child.proc.pid)}
    assert {"raylet", "gcs_server"} <= names, names  # Ray runs below it, and its env actors
    assert any(n.startswith("ray::EnvActor") for n in names), names  # (".step" while busy)
    assert ready["sandboxes"]
    kill_and_check(child)


def _fake_ray(tmp_path: Path) -> Path:
    fake = tmp_path / "site" / "ray"
    fake.mkdir(parents=True)
    return fake


def test_the_ray_watchdog_kills_only_ray_processes_once_the_driver_is_killed(spawn, tmp_path):
    child = spawn(["reaper", str(_fake_ray(tmp_path)), "hang"], tmp_path / "child.log")
    ready = child.expect("ready", timeout=60)
    before = tree(child.proc.pid)
    try:
        assert {ready["agent"], ready["kid"], ready["other"], ready["watchdog"]} <= set(before)
        ray_side = {p: before[p] for p in (ready["agent"], ready["kid"], ready["watchdog"])}
        child.kill()
        left = wait_gone(ray_side, set(), child.proc.pid)
        assert not left, f"the watchdog left Ray's processes running: {left}"
        # a process of the driver that is not Ray's is not the watchdog's to kill
        assert _running(ready["other"], before[ready["other"]])
    finally:
        cleanup(before)


def test_closing_the_ray_watchdog_reaps_what_is_left_and_ends_it(spawn, tmp_path):
    child = spawn(["reaper", str(_fake_ray(tmp_path)), "close"], tmp_path / "child.log")
    ready = child.expect("ready", timeout=60)
    procs = {ready[k]: ready["starts"][k] for k in ("agent", "kid", "other", "watchdog")}
    try:
        closed = child.expect("closed", timeout=60)
        assert closed["rc"] == 0 and closed["closed"] < 15.0
        for name in ("agent", "kid", "watchdog"):
            assert not _running(ready[name], ready["starts"][name]), name
        assert _running(ready["other"], ready["starts"]["other"])
        child.kill()
    finally:
        cleanup(procs)


def test_the_watchdog_follows_a_process_whatever_it_calls_itself(tmp_path):
    # a program may name itself ") Z 1 1 1 1" to pass for a zombie or another process: the
    # watchdog still follows it by pid and start time, and kills it
    script = tmp_path / "fake_ray" / "agent.py"
    script.parent.mkdir()
    script.write_text("import time\nopen('/proc/self/comm', 'w').write(') Z 1 1 1 1')\n"
                      "print(flush=True)\ntime.sleep(600)\n")
    kid = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE)
    try:
        kid.stdout.readline()
        follower = Follower(os.getpid(), str(script.parent), me=-1)
        assert follower.scan() == 1 and [p.pid for p in follower.alive()] == [kid.pid]
        assert follower.scan() == 0
        assert follower.reap(seconds=5.0) == 1
        assert kid.wait(timeout=10) == -signal.SIGKILL and follower.alive() == []
    finally:
        kid.kill()
        kid.wait()


def _rows(run_dir: Path, step: int) -> dict:
    """What the run database holds of round ``step``: its episodes and metrics (read-only)."""
    db = sqlite3.connect(f"file:{run_dir / 'run.sqlite'}?mode=ro", uri=True)
    try:
        episodes = db.execute(
            "SELECT env_sha, role, seed, token_ids, episode_return, stop_reason, failure "
            "FROM episodes WHERE step = ? ORDER BY env_sha, role, seed, token_ids",
            (step,)).fetchall()
        metrics = db.execute("SELECT name, value FROM metrics WHERE step = ? ORDER BY name",
                             (step,)).fetchall()
    finally:
        db.close()
    return {"episodes": episodes,
            "metrics": [m for m in metrics if not WALL_CLOCK_METRICS.search(m[0])]}


@pytest.mark.extra("ray")
@pytest.mark.timeout(1200)
def test_a_killed_ray_env_worker_fails_typed_and_the_run_goes_on_and_resumes(spawn, tmp_path):
    run = tmp_path / "run"
    child = spawn(["selfplay", str(run), "3", "1"], tmp_path / "child.log")
    assert child.expect("done")["done"] == 0
    killed = child.expect("killed")
    assert killed["sandboxes"] and not killed["left"], killed  # its sandboxes died with it
    assert child.expect("done")["done"] == 1  # the round with the dead worker completed
    round0, round1 = _rows(run, 0), _rows(run, 1)
    kill_and_check(child, settle=0.0)  # and the driver itself SIGKILLed in round 2

    failures = [json.loads(f) for *_x, f in round1["episodes"] if f]
    died = [f for f in failures if f.get("type") == "WorkerDied"]
    assert died, f"no episode of round 1 failed WorkerDied: {failures}"
    assert all(f"Ray env worker {killed['slot']}" in f["message"] for f in died), died
    assert len(died) < len(round1["episodes"])  # the other worker's episodes played on
    assert round0["episodes"] and not any(f and "WorkerDied" in f
                                          for *_x, f in round0["episodes"])

    resumed = spawn(["selfplay", str(run), "3", "-1"], tmp_path / "resume.log")
    assert resumed.expect("done")["done"] == 2
    below = tree(resumed.proc.pid)  # Ray, its watchdog, sandboxes: a clean exit ends them all
    try:
        assert resumed.finish() == 0, resumed.log.read_text()[-3000:]
        left = wait_gone(below, {resumed.proc.pid, *below}, resumed.proc.pid)
        assert not left, f"processes outlived a run that ended cleanly: {left}"
    finally:
        cleanup(below)
    assert _rows(run, 0) == round0 and _rows(run, 1) == round1  # both rounds intact
    db = sqlite3.connect(f"file:{run / 'run.sqlite'}?mode=ro", uri=True)
    assert db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    db.close()
