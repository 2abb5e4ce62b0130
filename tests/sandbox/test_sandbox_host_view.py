"""What a hostile program sees of the host, judged from the host.

On the standard tier (no namespaces) Landlock denies listing and reading /proc, but not path
lookups: ``os.stat("/proc/PID")`` found every host process and ``os.getcwd()`` gave the host path
of the scratch directory. As root where the kernel allows a mount namespace, the worker now gets
a private view (``spadekit.sandbox.worker_view``): a /proc of its own in which it sees only
itself, and neutral paths. seccomp refuses the syscalls that would tell one pid from another, on
every tier. ``spadekit doctor`` says what each tier shows of the host, measured in a worker.
"""

from __future__ import annotations

import json
import os
import re
import tempfile

import pytest

from conftest import TEST_CONFIG, TIERS
from spadekit.sandbox import SandboxConfig, SandboxPool

SPY = r'''
import glob, json, os, sys, time, resource

class SpyEnv:
    def reset(self, seed=None, options=None):
        return "spy", {}

    def step(self, action):
        arg = json.loads(action)
        out = {"listed": sorted(int(p[6:]) for p in glob.glob("/proc/[0-9]*"))}
        found = []
        for pid in arg["pids"]:
            try:
                os.stat("/proc/%d" % pid)
                found.append(pid)
            except OSError:
                pass
        out["stat"] = found
        probes = {"getpgid": os.getpgid, "getsid": os.getsid,
                  "sched_getaffinity": os.sched_getaffinity,
                  "sched_getscheduler": os.sched_getscheduler,
                  "getpriority": lambda p: os.getpriority(os.PRIO_PROCESS, p),
                  "prlimit": lambda p: resource.prlimit(p, resource.RLIMIT_NOFILE),
                  "cpu_clock": lambda p: time.clock_getres(((~p) << 3) | 2),
                  "pidfd_open": lambda p: os.close(os.pidfd_open(p))}
        oracles = {}
        for name, call in probes.items():
            answers = []
            for pid in (arg["alive"], arg["gone"]):
                try:
                    call(pid)
                    answers.append("ok")
                except OSError as exc:
                    answers.append(exc.errno)
            oracles[name] = answers
        out["oracles"] = oracles
        out["ppid"] = os.getppid()
        try:
            out["cwd"] = os.getcwd()
        except OSError as exc:
            out["cwd"] = str(exc)
        try:
            out["readlink_cwd"] = os.readlink("/proc/self/cwd")
        except OSError as exc:
            out["readlink_cwd"] = str(exc)
        main = sys.modules["__main__"]
        out["strings"] = [__file__, os.path.abspath("."), dict(os.environ), list(sys.argv),
                          list(sys.path), getattr(main, "__file__", None),
                          main.main.__code__.co_filename,
                          sorted(str(getattr(m, "__file__", "")) for m in list(sys.modules.values()))]
        return json.dumps(out), 0.0, True, False, {}
'''


def _host_pids() -> list[int]:
    return sorted(int(p) for p in os.listdir("/proc") if p.isdigit())


def _spy(pool: SandboxPool) -> tuple[dict, object]:
    sb = pool.acquire(SPY)
    env = sb.new_env()
    env.reset()
    pids = _host_pids()
    gone = next(p for p in range(30000, 1 << 22) if p not in set(pids))
    action = json.dumps({"pids": pids, "alive": os.getpid(), "gone": gone})
    return json.loads(env.step(action)[0]), sb


@pytest.fixture(scope="module", params=TIERS or ["none"])
def tier_pool(request):
    if request.param == "none":
        pytest.skip("no safe sandbox tier works on this machine")
    pool = SandboxPool(SandboxConfig(tier=request.param, **TEST_CONFIG), warm=0)
    yield pool
    pool.close()


def test_no_syscall_tells_a_live_host_pid_from_a_dead_one(tier_pool):
    seen, sb = _spy(tier_pool)
    try:
        leaks = {name: answers for name, answers in seen["oracles"].items()
                 if answers[0] != answers[1]}
        assert leaks == {}, f"these calls answer differently for a live and a dead pid: {leaks}"
        assert seen["ppid"] != os.getpid()  # the trainer's pid is not shown
    finally:
        sb.close()


def _another_process_scratch(line: str) -> bool:
    """True for a mountinfo line that is the scratch tmpfs of a sandbox another process made."""
    fields = line.split()
    roots = "|".join(re.escape(d) for d in {tempfile.gettempdir(),  # launch.py's mkdtemp
                                            os.path.realpath(tempfile.gettempdir())})
    found = (re.fullmatch(rf"(?:{roots})/spadekit-sbx-(\d+)-\d+-\w+", fields[4])
             if len(fields) > 4 else None)
    return bool(found) and int(found.group(1)) != os.getpid() and " - tmpfs " in line


def test_another_process_scratch_is_told_from_this_process_mounts():
    tmp = tempfile.gettempdir()
    mine = f"50 27 0:44 / {tmp}/spadekit-sbx-{os.getpid()}-7-ab_c rw,nosuid - tmpfs tmpfs rw"
    theirs = mine.replace(f"sbx-{os.getpid()}-", f"sbx-{os.getpid() + 1}-")
    assert _another_process_scratch(theirs) and not _another_process_scratch(mine)
    assert not _another_process_scratch(theirs.replace(" - tmpfs ", " - ext4 "))
    assert not _another_process_scratch("50 27 0:44 / /tmp/scratch rw - tmpfs tmpfs rw")


def test_standard_tier_hides_host_processes_and_host_paths():
    if "standard" not in TIERS:
        pytest.skip("the standard tier does not boot here")
    pool = SandboxPool(SandboxConfig(tier="standard", **TEST_CONFIG), warm=0)
    try:
        if getattr(pool.plan, "private_view", None) is False:
            from spadekit.sandbox.isolation import probe_layers

            why = probe_layers(pool.config)["private_view"].detail
            pytest.skip(f"no private view here, the standard tier shows the host: {why}")
        before = open("/proc/self/mountinfo").read()
        seen, sb = _spy(pool)
        try:
            own = set(sb.worker.host_pids)
            assert set(seen["listed"]) <= own  # glob /proc/[0-9]*
            assert set(seen["stat"]) <= own and seen["stat"], seen["stat"]  # itself, only
            text = json.dumps(seen)
            scratch = sb.worker.scratch
            from spadekit.sandbox.launch import runtime_lib

            for host_path in (scratch, runtime_lib(), "spadekit-sbx-", "spadekit-rt-"):
                assert host_path not in text, f"{host_path} shown to the program"
            assert seen["cwd"] == seen["readlink_cwd"] == "/tmp/scratch"
            # the view's mounts stay in the worker's namespace; the host's table is unchanged
            # but for the scratch tmpfs the parent mounts itself (and the scratch of sandboxes
            # that another test process, a pytest-xdist worker, starts meanwhile: the table is
            # the machine's)
            after = [line for line in open("/proc/self/mountinfo").read().splitlines()
                     if line not in before and f" {scratch} " not in line
                     and not _another_process_scratch(line)]
            assert after == []
        finally:
            sb.close()
    finally:
        pool.close()


def test_a_view_never_runs_a_program_as_root():
    from spadekit.sandbox.worker_view import drop_to

    for uid in (0, None, True, -1):
        with pytest.raises(ValueError):
            drop_to(uid)


def test_doctor_says_what_each_tier_shows_of_the_host(monkeypatch):
    if "standard" not in TIERS:
        pytest.skip("the standard tier does not boot here")
    from spadekit.sandbox import isolation

    shown = isolation.tier_limits(SandboxConfig(allow_unsafe=True))
    for tier in TIERS:
        view = shown[tier]["host_view"]
        assert view["parent_pid"] == "hidden"
        if tier == "strong" or isolation.probe_layers(SandboxConfig())["private_view"].available:
            assert view["processes"] == "hidden" and view["paths"] == "neutral", view
    # where the kernel refuses the view (or not root), the standard tier says what it shows
    monkeypatch.setattr(isolation, "_private_view_works",
                        lambda root, config: (False, "refused here (test)"))
    view = isolation.tier_limits(SandboxConfig(allow_unsafe=True))["standard"]["host_view"]
    assert view["processes"] == "visible" and view["visible_host_pids"] > 0
    assert view["paths"] == "host" and "Landlock" in view["how"]
    from rich.console import Console

    from spadekit.cli.doctor import _host_view_text

    console = Console(width=300, record=True)
    console.print(_host_view_text(view))
    assert "host process(es) visible" in console.export_text()
