"""Isolation that holds on every tier, judged from the host.

- IPC: SysV message queues, semaphores, shared memory and POSIX message queues are denied inside
  workers, ``/dev/shm`` is out of reach, one program's worker cannot reach what another left,
  and nothing survives either worker (checked in /proc/sysvipc, /dev/shm and with mq_open).
- Worker uids are allocated host-wide: several processes, each with its own pools, never hold
  the same uid, and a uid some process still runs as is never handed out.
- Scratch space is a size-limited tmpfs; the CPU controller caps a busy worker; a worker idle
  between requests is stopped, so a background thread it left spinning burns (almost) no CPU.
- ``spadekit doctor`` reports these limits per tier, measured in a real worker.

Every test runs once per tier that boots here (strong, standard), like the attack matrix.
"""

from __future__ import annotations

import ctypes
import errno
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import ECHO, TEST_CONFIG, TIERS, assert_pool_works, live_processes_of_uid
from spadekit.sandbox import SandboxConfig, SandboxPool
from spadekit.sandbox.launch import _UidAllocator, uid_lock_dir

SRC = Path(__file__).resolve().parents[2] / "src"
tiers = pytest.mark.parametrize("tier", TIERS or [pytest.param("none", marks=pytest.mark.skip(
    reason="no safe sandbox tier works on this machine"))])

PREAMBLE = '''
import ctypes, errno, json, os, threading, time
libc = ctypes.CDLL(None, use_errno=True)
def err():
    return errno.errorcode.get(ctypes.get_errno(), "?")
def mq():
    rt = ctypes.CDLL("librt.so.1", use_errno=True)
    rt.mq_open.restype = ctypes.c_int
    return rt
'''

IPC_WRITER = PREAMBLE + '''
class WriterEnv:
    def reset(self, seed=None, options=None):
        return "ready", {}
    def step(self, action):
        arg = json.loads(action)
        key, out = arg["key"], {}
        q = libc.msgget(key, 0o1666)  # IPC_CREAT | 0666
        out["msgget"] = err() if q == -1 else "created"
        if q != -1:
            msg = ctypes.create_string_buffer(b"\\x01\\x00\\x00\\x00\\x00\\x00\\x00\\x00secret", 14)
            out["msgsnd"] = "sent" if libc.msgsnd(q, msg, 6, 0) == 0 else err()
        out["semget"] = err() if libc.semget(key, 1, 0o1666) == -1 else "created"
        out["shmget"] = err() if libc.shmget(key, 4096, 0o1666) == -1 else "created"
        fd = mq().mq_open(arg["mq"].encode(), os.O_CREAT | os.O_RDWR, 0o666, None)
        out["mq_open"] = err() if fd == -1 else "created"
        try:
            with open("/dev/shm" + arg["mq"], "w") as fh:
                fh.write("secret")
            out["shm_open"] = "created"
        except OSError as exc:
            out["shm_open"] = errno.errorcode.get(exc.errno, "?")
        return json.dumps(out), 0.0, False, False, {}
'''

IPC_READER = PREAMBLE + '''
class ReaderEnv:
    def reset(self, seed=None, options=None):
        return "ready", {}
    def step(self, action):
        arg = json.loads(action)
        key, out = arg["key"], {}
        q = libc.msgget(key, 0)
        if q == -1:
            out["msgrcv"] = err()
        else:
            buf = ctypes.create_string_buffer(64)
            n = libc.msgrcv(q, buf, 56, 0, 0o4000)  # IPC_NOWAIT
            out["msgrcv"] = buf.raw[8:8 + n].decode() if n >= 0 else err()
        out["shmget"] = err() if libc.shmget(key, 0, 0) == -1 else "found"
        fd = mq().mq_open(arg["mq"].encode(), os.O_RDONLY, 0, None)
        out["mq_open"] = err() if fd == -1 else "found"
        try:
            out["shm_open"] = open("/dev/shm" + arg["mq"]).read()
        except OSError as exc:
            out["shm_open"] = errno.errorcode.get(exc.errno, "?")
        return json.dumps(out), 0.0, False, False, {}
'''


def sysv_keys() -> set[str]:
    """Keys of every SysV IPC object on the host (what ``ipcs`` lists)."""
    keys = set()
    for kind in ("msg", "sem", "shm"):
        lines = Path(f"/proc/sysvipc/{kind}").read_text().splitlines()[1:]
        keys |= {f"{kind}:{line.split()[0]}:{line.split()[1]}" for line in lines}  # key, id
    return keys


def host_mq_exists(name: str) -> bool:
    rt = ctypes.CDLL("librt.so.1", use_errno=True)
    rt.mq_open.restype = ctypes.c_int
    fd = rt.mq_open(name.encode(), os.O_RDONLY, 0, None)
    if fd == -1:
        assert ctypes.get_errno() == errno.ENOENT
        return False
    os.close(fd)
    rt.mq_unlink(name.encode())
    return True


def test_host_side_ipc_checks_see_what_they_look_for():
    """The host checks below are not vacuous: an object the host creates shows up in them."""
    libc = ctypes.CDLL(None, use_errno=True)
    key = 0x5B2C0000 + os.getpid() % 0xFFFF
    q = libc.msgget(key, 0o1600)
    assert q != -1
    try:
        assert f"msg:{key}:{q}" in sysv_keys()
    finally:
        libc.msgctl(q, 0, None)  # IPC_RMID
    rt = ctypes.CDLL("librt.so.1", use_errno=True)
    rt.mq_open.restype = ctypes.c_int
    name = f"/spadekit-check-{os.getpid()}"
    fd = rt.mq_open(name.encode(), os.O_CREAT | os.O_RDWR, 0o600, None)
    assert fd != -1
    os.close(fd)
    assert host_mq_exists(name) and not host_mq_exists(name)


def test_ipc_is_denied_and_nothing_survives(pool):
    key = 0x5B2D0000 + os.getpid() % 0xFFFF
    name = f"/spadekit-ipc-{os.getpid()}-{pool.report.tier}"
    shm_before = set(os.listdir("/dev/shm"))
    keys_before = sysv_keys()
    arg = json.dumps({"key": key, "mq": name})
    writer = pool.acquire(IPC_WRITER)
    reader = pool.acquire(IPC_READER)
    try:
        w_env, r_env = writer.new_env(), reader.new_env()
        w_env.reset()
        r_env.reset()
        wrote = json.loads(w_env.step(arg)[0])
        read = json.loads(r_env.step(arg)[0])
        # both workers still alive here: nothing of the writer's may be visible on the host
        assert sysv_keys() == keys_before
        assert not host_mq_exists(name)
    finally:
        writer.close()
        reader.close()
    assert wrote == {"msgget": "EPERM", "semget": "EPERM", "shmget": "EPERM",
                     "mq_open": "EPERM", "shm_open": wrote["shm_open"]}, wrote
    assert wrote["shm_open"] in ("EACCES", "EROFS"), wrote  # Landlock / read-only private /dev
    assert read["msgrcv"] == "EPERM" and read["shmget"] == "EPERM", read
    assert read["mq_open"] == "EPERM" and read["shm_open"] in ("EACCES", "ENOENT"), read
    assert sysv_keys() == keys_before
    assert not host_mq_exists(name)
    assert set(os.listdir("/dev/shm")) == shm_before
    assert_pool_works(pool)


# -- uids ----------------------------------------------------------------------------------


needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="per-worker uids exist only as root")


def _ids(pid: int) -> dict[str, list[str]]:
    with open(f"/proc/{pid}/status") as fh:
        rows = dict(line.rstrip("\n").split(":", 1) for line in fh if ":" in line)
    return {k: rows[k].split() for k in ("Uid", "Gid", "Groups", "CapPrm", "CapEff", "CapAmb")}


@needs_root
@tiers
@pytest.mark.parametrize("setpriv", [True, False], ids=["setpriv", "popen-user"])
def test_a_worker_runs_as_its_uid_alone_however_it_was_started(tier, setpriv, monkeypatch):
    """Each host process of a worker has real, effective, saved and filesystem ids all equal to
    its uid, no supplementary group and no capability: when ``setpriv`` drops the ids (Python
    may then ``vfork``, the caller's page tables are not copied) and when ``Popen`` does."""
    from spadekit.sandbox import launch

    if setpriv and launch.setpriv_path() is None:
        pytest.skip("no setpriv on this machine")
    if not setpriv:
        monkeypatch.setattr(launch, "setpriv_path", lambda: None)
    seen = []
    real_popen = subprocess.Popen

    def spy(argv, *args, **kwargs):
        seen.append((list(argv), sorted(kwargs)))
        return real_popen(argv, *args, **kwargs)

    monkeypatch.setattr(subprocess, "Popen", spy)
    groups = os.getgroups()
    os.setgroups([4242])  # a supplementary group of the caller the worker must not keep
    pool = SandboxPool(SandboxConfig(tier=tier, **TEST_CONFIG), warm=0)
    try:
        sb = pool.acquire(ECHO)
        env = sb.new_env(max_turns=3)
        assert env.reset(seed=1)[0] == "echo ready"
        uid = sb.worker.uid
        assert uid is not None and uid != 0
        pids = sorted(sb.worker.host_pids)
        for pid in pids:
            ids = _ids(pid)
            assert ids["Uid"] == [str(uid)] * 4 and ids["Gid"] == [str(uid)] * 4, (pid, ids)
            assert ids["Groups"] == [], (pid, ids)
            assert {int(ids[k][0], 16) for k in ("CapPrm", "CapEff", "CapAmb")} == {0}, ids
        spawned = [(argv, kw) for argv, kw in seen if "start_new_session" in kw]
        assert spawned, seen
        for argv, kw in spawned:
            if tier == "strong":
                assert ("user" not in kw) == setpriv, (argv, kw)
                assert (argv[0] == launch.setpriv_path()) == setpriv, argv
        sb.close()
    finally:
        pool.close()
        os.setgroups(groups)


FAKE_SETPRIVS = {
    # busybox's applet: four options, --reuid is not one of them
    "rejects": "#!/bin/sh\necho 'Usage: setpriv [OPTIONS] PROG ARGS' >&2\nexit 1\n",
    # takes the options and runs the program unchanged, still root
    "does-nothing": "#!/bin/sh\nwhile [ \"$1\" != -- ]; do shift; done\nshift\nexec \"$@\"\n",
}


@needs_root
@pytest.mark.parametrize("kind", sorted(FAKE_SETPRIVS))
def test_a_setpriv_that_does_not_do_the_job_is_not_used(kind, tmp_path, monkeypatch):
    """``setpriv_path`` probes the binary (ids and groups of a ``cat`` run through it): one that
    rejects the options or leaves the ids alone is passed over and ``Popen`` changes them."""
    from spadekit.sandbox import launch

    fake = tmp_path / "setpriv"
    fake.write_text(FAKE_SETPRIVS[kind])
    fake.chmod(0o755)
    monkeypatch.setattr(launch, "SETPRIV_CANDIDATES", (str(fake),))
    launch.setpriv_path.cache_clear()
    try:
        assert launch.setpriv_path() is None
        argv, kwargs = launch.as_user(["/bin/true"], 1_234_567)
        assert argv == ["/bin/true"] and kwargs == {"user": 1_234_567, "group": 1_234_567,
                                                   "extra_groups": []}
    finally:
        monkeypatch.undo()
        launch.setpriv_path.cache_clear()
    assert launch.setpriv_path() in (None, *launch.SETPRIV_CANDIDATES)


@needs_root
@pytest.mark.skipif("strong" not in TIERS, reason="the strong tier does not boot here")
def test_a_worker_that_cannot_start_says_what_its_launcher_printed(tmp_path, monkeypatch):
    """Whatever ends a worker before its hello (here a launcher that refuses its options), the
    start error carries the end of what it printed, not only an exit code."""
    from spadekit.common.errors import SandboxStartError
    from spadekit.sandbox import launch

    fake = tmp_path / "setpriv"
    monkeypatch.setattr(launch, "as_user",
                        lambda argv, uid: ([str(fake), f"--reuid={uid}", "--", *argv], {}))
    # one that dies at once, and one that prints its cause and then hangs (the start times out)
    for script, printed, how in (
            (FAKE_SETPRIVS["rejects"], "Usage: setpriv", "did not start"),
            ("#!/bin/sh\necho 'stuck on a mount' >&2\nexec sleep 60\n", "stuck on a mount",
             "timed out")):
        fake.write_text(script)
        fake.chmod(0o755)
        pool = SandboxPool(SandboxConfig(tier="strong", start_timeout=2.0, **TEST_CONFIG),
                           warm=0)
        try:
            with pytest.raises(SandboxStartError, match=printed) as info:
                pool.acquire(ECHO)
            assert how in info.value.message
        finally:
            pool.close()


@needs_root
def test_two_allocators_never_hand_out_one_uid():
    """Two allocators stand for two processes (the old allocator derived uids from the pid, so
    two processes whose pids agree modulo 100 got the same ones)."""
    base = 3_100_000
    cursor = Path(uid_lock_dir()) / f"next-{base}"  # host-wide: it outlives every process
    cursor.write_text("0")  # this range is the test's own
    a, b = _UidAllocator(), _UidAllocator()
    got_a = [a.take(base) for _ in range(4)]
    got_b = [b.take(base) for _ in range(4)]
    assert len(set(got_a) | set(got_b)) == 8, (got_a, got_b)
    a.give(got_a[0])
    # round robin host-wide: neither another process nor the one that gave a uid back takes it
    # again at once (a process still seen under it then belongs to the worker that had it,
    # never to its successor: under pytest-xdist two workers' sandboxes come and go together)
    c = _UidAllocator()  # a third process
    taken = [c.take(base), a.take(base), b.take(base)]
    assert len(set(taken)) == 3 and not set(taken) & set(got_a + got_b), (taken, got_a, got_b)
    for uid, owner in zip(taken, (c, a, b)):
        owner.give(uid)
    assert got_a[0] == base and taken == [base + 8, base + 9, base + 10], (got_a, taken)
    # a uid given back is free again, host-wide, when the turn comes round to it
    cursor.write_text(str(got_a[2] - base))
    assert c.take(base) == base + 8  # the next free one after the cursor
    cursor.write_text("damaged\x00")  # a damaged cursor starts from the beginning of the range
    assert c.take(base) == got_a[0]
    c.give(base + 8)
    c.give(got_a[0])
    for uid in got_a[1:]:
        a.give(uid)
    for uid in got_b:
        b.give(uid)
    lock_dir = uid_lock_dir()
    st = os.stat(lock_dir)
    assert st.st_uid == 0 and not st.st_mode & 0o022


@needs_root
def test_a_held_or_odd_cursor_never_stalls_a_worker_start(tmp_path):
    """The host-wide cursor only orders the search: a process that keeps it locked (a child
    forked while its parent held it keeps the lock for its life) or a cursor that is not a
    regular file costs at most ``CURSOR_WAIT_S``, and uids are still handed out uniquely."""
    import fcntl

    from spadekit.sandbox import launch

    base = 3_300_000
    cursor = Path(uid_lock_dir()) / f"next-{base}"
    cursor.unlink(missing_ok=True)
    holder = subprocess.Popen([sys.executable, "-c", (
        "import fcntl, os, sys, time\n"
        f"fd = os.open({str(cursor)!r}, os.O_RDWR | os.O_CREAT, 0o600)\n"
        "fcntl.flock(fd, fcntl.LOCK_EX)\nprint('held', flush=True)\ntime.sleep(60)\n")],
        stdout=subprocess.PIPE, text=True)
    a = _UidAllocator()
    try:
        assert holder.stdout.readline().strip() == "held"
        t = time.monotonic()
        got = [a.take(base), a.take(base)]
        assert time.monotonic() - t < 4 * launch.CURSOR_WAIT_S + 1, time.monotonic() - t
        assert len(set(got)) == 2
    finally:
        holder.kill()
        holder.wait()
    for uid in got:
        a.give(uid)
    cursor.unlink()
    os.mkfifo(cursor, 0o600)  # not a regular file: passed over, no seek error, no hang
    try:
        uid = a.take(base)
        assert base <= uid < base + launch.UID_RANGE
        a.give(uid)
    finally:
        cursor.unlink()
    fd = os.open(cursor, os.O_RDWR | os.O_CREAT, 0o600)  # and a plain one works again
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    os.close(fd)


@needs_root
def test_a_uid_some_process_runs_as_is_skipped():
    """A worker left running by a killed trainer holds no lock, but still owns its uid."""
    base = 3_200_000
    old_style_first = base + (os.getpid() % 100) * 10000  # what the pid-derived scheme picked
    squatters = [subprocess.Popen(["sleep", "30"], user=u, group=u, extra_groups=[])
                 for u in (base, old_style_first)]
    try:
        alloc = _UidAllocator()
        got = [alloc.take(base) for _ in range(3)]
        assert not {base, old_style_first} & set(got), got
        for uid in got:
            alloc.give(uid)
    finally:
        for proc in squatters:
            proc.kill()
            proc.wait()


POOL_DRIVER = r'''
import json, sys
sys.path.insert(0, sys.argv[1])
from spadekit.sandbox import SandboxConfig, SandboxPool
pools = [SandboxPool(SandboxConfig(tier=sys.argv[2]), warm=2) for _ in range(2)]
held = [p.acquire(sys.argv[3]) for p in pools for _ in range(2)]
import time
deadline = time.monotonic() + 20
while sum(len(p.sandboxes()) for p in pools) < 8 and time.monotonic() < deadline:
    time.sleep(0.02)  # wait for the warm refills
boxes = [s for p in pools for s in p.sandboxes()]
print(json.dumps({"uids": [s.worker.uid for s in boxes],
                  "pids": sorted(p for s in boxes for p in s.worker.host_pids)}), flush=True)
sys.stdin.read()  # hold everything until the test has looked
for p in pools:
    p.close()
'''


@needs_root
@tiers
def test_live_uids_never_collide_across_processes(tier):
    """Three processes, two pools each, all live at once: every live worker uid is distinct
    and owned only by that worker's processes."""
    procs = [subprocess.Popen([sys.executable, "-c", POOL_DRIVER, str(SRC), tier, ECHO],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
             for _ in range(3)]
    try:
        infos = [json.loads(p.stdout.readline()) for p in procs]
        uids = [u for info in infos for u in info["uids"]]
        assert len(uids) == 24 and None not in uids
        assert len(set(uids)) == len(uids), sorted(uids)
        for info in infos:
            for uid in info["uids"]:
                assert set(live_processes_of_uid(uid)) <= set(info["pids"]), uid
    finally:
        for p in procs:
            p.stdin.close()
        for p in procs:
            p.wait(timeout=60)
    # every worker died with its pool (a uid may already serve a new worker of another pool)
    driver_pids = {pid for info in infos for pid in info["pids"]}
    for uid in uids:
        assert not driver_pids & set(live_processes_of_uid(uid)), uid


# -- scratch and CPU ---------------------------------------------------------------------------

FILLER = PREAMBLE + '''
class FillerEnv:
    def reset(self, seed=None, options=None):
        return "ready", {}
    def step(self, action):
        out = {"written_mb": 0, "error": None, "statvfs_mb": os.statvfs(".").f_blocks *
               os.statvfs(".").f_frsize / 1048576}
        chunk = b"x" * (1 << 20)
        try:
            for i in range(12):  # 12 files of 1 MiB: each under the per-file limit
                with open(os.path.join(action, "fill%d" % i), "wb") as fh:
                    fh.write(chunk)
                out["written_mb"] += 1
        except OSError as exc:
            out["error"] = errno.errorcode.get(exc.errno, "?")
        return json.dumps(out), 0.0, False, False, {}
'''


@tiers
def test_scratch_is_a_size_limited_tmpfs(tier):
    pool = SandboxPool(SandboxConfig(tier=tier, scratch_mb=4, **TEST_CONFIG), warm=0)
    try:
        if not (pool.plan.bwrap or pool.plan.scratch_tmpfs):
            pytest.skip("no tmpfs scratch on this tier here (not root): per-file limit only")
        places = ["."] + (["/tmp"] if pool.plan.bwrap else [])
        for place in places:
            sb = pool.acquire(FILLER)
            env = sb.new_env()
            env.reset()
            res = json.loads(env.step(place)[0])
            scratch = sb.worker.scratch
            sb.close()
            assert res["statvfs_mb"] == pytest.approx(4.0, rel=0.01), res
            assert res["error"] == "ENOSPC" and res["written_mb"] <= 4, (place, res)
            assert not os.path.exists(scratch) and not os.path.ismount(scratch)
        assert_pool_works(pool)
    finally:
        pool.close()


SPINNER = PREAMBLE + '''
COUNT = [0]
def spin():
    while True:
        COUNT[0] += 1
class SpinnerEnv:
    def reset(self, seed=None, options=None):
        return "ready", {}
    def step(self, action):
        if action == "start":
            threading.Thread(target=spin, daemon=True).start()
        elif action.startswith("sleep"):
            time.sleep(float(action[5:]))
        elif action.startswith("busy"):
            end = time.monotonic() + float(action[4:])
            while time.monotonic() < end:
                pass
        before = COUNT[0]
        time.sleep(0.05)
        return json.dumps({"spun": COUNT[0] - before}), 0.0, False, False, {}
'''


def cpu_seconds(pids) -> float:
    total = 0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += int(fields[11]) + int(fields[12])  # utime + stime, all threads
    return total / os.sysconf("SC_CLK_TCK")


def idle_cpu(tier: str, idle_stop_ms: float) -> tuple[float, float, int]:
    """CPU seconds a worker whose program left a thread spinning uses during a 0.6 s request
    (the reference: what the thread gets under the machine's present load) and during 0.6 s
    without requests; plus how often it was stopped."""
    pool = SandboxPool(SandboxConfig(tier=tier, idle_stop_ms=idle_stop_ms, **TEST_CONFIG),
                       warm=0)
    try:
        sb = pool.acquire(SPINNER)
        env = sb.new_env()
        env.reset()
        assert json.loads(env.step("start")[0])["spun"] > 0
        before = cpu_seconds(sb.worker.host_pids)
        env.step("sleep0.55")  # the request sleeps 0.55 s + 0.05 s; the thread spins meanwhile
        during = cpu_seconds(sb.worker.host_pids) - before
        before = cpu_seconds(sb.worker.host_pids)
        time.sleep(0.6)  # no request: the background thread is on its own
        idle = cpu_seconds(sb.worker.host_pids) - before
        assert json.loads(env.step("again")[0])["spun"] > 0  # continued: it spins again
        stops = sb.worker.stops
        sb.close()
        return during, idle, stops
    finally:
        pool.close()


@tiers
def test_idle_worker_with_a_busy_thread_uses_almost_no_cpu(tier):
    during, idle, stops = idle_cpu(tier, 20.0)
    assert stops >= 1
    assert idle < 0.08, f"an idle worker burned {idle:.2f} s of CPU in 0.6 s"
    assert idle < during / 3 + 0.015, (idle, during)  # one clock tick of slack
    # with idle stopping off the thread burns as much between requests as during one
    during, idle, stops = idle_cpu(tier, 0)
    assert stops == 0
    assert idle > during / 3, (idle, during)


@tiers
def test_requests_racing_the_idle_stopper_never_hang(tier):
    """Requests that arrive just as the worker is being stopped still get their answer: gaps
    around a 1 ms idle limit, several hundred times (a lost wake-up would be a timeout)."""
    import random

    pool = SandboxPool(SandboxConfig(tier=tier, idle_stop_ms=1, **TEST_CONFIG), warm=0)
    try:
        sb = pool.acquire(ECHO)
        env = sb.new_env(max_turns=1000)
        env.reset()
        rng = random.Random(13)
        for i in range(300):
            time.sleep(rng.choice((0.0, 0.0005, 0.001, 0.002, 0.004)))
            assert env.step(str(i))[0] == f"echo:{i}"
        assert sb.worker.stops > 10
        sb.close()
    finally:
        pool.close()


def test_batched_requests_continue_stopped_workers(pool):
    """The batch path (rollouts step many sandboxes at once) wakes idle-stopped workers too."""
    from spadekit.sandbox.batch import step_many

    boxes = [pool.acquire(ECHO) for _ in range(2)]
    try:
        envs = [sb.new_env(max_turns=5) for sb in boxes]
        for env in envs:
            env.reset()
        deadline = time.monotonic() + 10  # idle 20 ms; the stopper thread may wait its turn
        while not all(sb.worker.stopped for sb in boxes) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert all(sb.worker.stopped for sb in boxes)  # both workers are stopped now
        results = step_many([(env, f"a{i}") for i, env in enumerate(envs)])
        assert [r[0] for r in results] == ["echo:a0", "echo:a1"], results
    finally:
        for sb in boxes:
            sb.close()


@tiers
def test_cpu_quota_caps_a_busy_worker(tier):
    pool = SandboxPool(SandboxConfig(tier=tier, cpu_quota=0.2, **TEST_CONFIG), warm=0)
    try:
        if not pool.plan.cgroup_cpu:
            pytest.skip("no per-worker CPU controller here")
        sb = pool.acquire(SPINNER)
        env = sb.new_env()
        env.reset()
        before, t0 = cpu_seconds(sb.worker.host_pids), time.monotonic()
        env.step("busy0.8")
        used, wall = cpu_seconds(sb.worker.host_pids) - before, time.monotonic() - t0
        if sb.worker.cgroup.mode == "v1":  # its own top-level cpu group: below a shared parent
            # all workers together would weigh one process (validations/s halved on a busy host)
            line = [x for x in Path(f"/proc/{sb.worker.proc.pid}/cgroup").read_text().split()
                    if x.split(":")[1].split(",").count("cpu")]
            assert line and line[0].split(":")[2].count("/") == 1, line
        sb.close()
        assert used < 0.3 * wall, f"{used:.2f} s CPU in {wall:.2f} s with a 0.2 CPU quota"
    finally:
        pool.close()


# -- doctor --------------------------------------------------------------------------------


def test_doctor_reports_limits_per_tier():
    from spadekit.cli.doctor import collect

    tiers_seen = collect()["sandbox"]["tiers"]
    assert set(tiers_seen) == {"strong", "standard"}
    for tier in TIERS:
        info = tiers_seen[tier]
        assert info["available"] is True
        assert info["ipc"]["msgget"] == "denied (EPERM)" and \
            info["ipc"]["mq_open"] == "denied (EPERM)"
        assert info["ipc"]["dev_shm"].startswith("not writable")
        assert info["cpu"]["idle_stop_ms"] == SandboxConfig().idle_stop_ms
        if info["scratch"]["limit_mb"] is not None:
            assert info["scratch"]["measured_mb"] == pytest.approx(SandboxConfig().scratch_mb,
                                                                   rel=0.01)
    out = subprocess.run([sys.executable, "-m", "spadekit.cli.app", "doctor", "--json"],
                         capture_output=True, text=True, timeout=120,
                         env={**os.environ, "PYTHONPATH": str(SRC)})
    assert out.returncode == 0, out.stderr[-2000:]
    assert set(json.loads(out.stdout)["sandbox"]["tiers"]) == {"strong", "standard"}


def test_the_runtime_library_is_byte_compiled_for_the_workers():
    """Every module of the workers' runtime library has its bytecode next to it, in the plain
    (not optimized) form the workers read, wherever this process keeps its own."""
    from spadekit.sandbox import launch

    root = Path(launch.runtime_lib())
    tag = sys.implementation.cache_tag
    sources = sorted(root.rglob("*.py"))
    assert sources
    for src in sources:
        assert (src.parent / "__pycache__" / f"{src.stem}.{tag}.pyc").is_file(), src
