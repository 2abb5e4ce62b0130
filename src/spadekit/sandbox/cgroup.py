"""Per-worker cgroups (v1 ``pids`` + ``memory`` controllers, or a v2 subtree with both), plus
the CPU controller (v1 ``cpu``, v2 ``cpu``) where the host has it.

A cgroup gives each worker a reliable memory cap and task limit, a CPU quota, and a handle to
kill everything the worker owns. All operations are best effort and never raise into the caller: a host that does
not allow cgroups simply runs without this layer (the isolation report says so). Leaked directories
from a killed trainer are swept on the next start (their names carry the owner's pid).
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

ROOT = Path("/sys/fs/cgroup")
PREFIX = "spadekit"
CPU_PERIOD_US = 100_000


def detect() -> tuple[str | None, str]:
    """Return (mode, detail) where mode is ``v1``, ``v2`` or None."""
    if os.geteuid() != 0:
        return None, "not root: per-worker cgroups need a delegated subtree (not set up)"
    v1 = [ROOT / "pids", ROOT / "memory"]
    if all((p / "cgroup.procs").exists() for p in v1):
        try:
            for p in v1:
                (p / PREFIX).mkdir(exist_ok=True)
            return "v1", "cgroup v1 pids+memory controllers"
        except OSError as exc:
            return None, f"cgroup v1 not writable: {exc}"
    ctrl = ROOT / "cgroup.controllers"
    if ctrl.exists():
        have = set(ctrl.read_text().split())
        if {"pids", "memory"} <= have:
            try:
                base = ROOT / PREFIX
                base.mkdir(exist_ok=True)
                (ROOT / "cgroup.subtree_control").write_text("+pids +memory")
                (base / "cgroup.subtree_control").write_text("+pids +memory")
                return "v2", "cgroup v2 with pids+memory"
            except OSError as exc:
                return None, f"cgroup v2 not writable: {exc}"
        return None, f"cgroup v2 without pids+memory controllers ({' '.join(sorted(have)) or 'none'})"
    return None, "no cgroup filesystem found"


def detect_cpu(mode: str | None) -> tuple[bool, str]:
    """Whether per-worker cgroups can carry a CPU quota, given ``detect()``'s mode."""
    if mode is None:
        return False, "no per-worker cgroups"
    if mode == "v1":
        cpu = ROOT / "cpu"
        if not (cpu / "cgroup.procs").exists() or not (cpu / "cpu.cfs_quota_us").exists():
            return False, "cgroup v1 without the cpu controller"
        if not os.access(cpu, os.W_OK):
            return False, "cgroup v1 cpu controller not writable"
        return True, "cgroup v1 cpu.cfs_quota_us"
    if "cpu" not in (ROOT / "cgroup.controllers").read_text().split():
        return False, "cgroup v2 without the cpu controller"
    try:
        for d in (ROOT, ROOT / PREFIX):
            (d / "cgroup.subtree_control").write_text("+cpu")
    except OSError as exc:
        return False, f"cgroup v2 cpu controller not delegable: {exc}"
    return True, "cgroup v2 cpu.max"


class WorkerCgroup:
    """The cgroup of one worker; ``create`` returns None where cgroups are not usable."""

    def __init__(self, mode: str, name: str, cpu: bool = False) -> None:
        self.mode = mode
        self.name = name
        self.cpu = cpu
        if mode == "v1":
            self.dirs = [ROOT / "pids" / PREFIX / name, ROOT / "memory" / PREFIX / name]
            if cpu:  # top level, not below a shared parent: see cpu_dir
                self.dirs.append(cpu_dir(name))
        else:
            self.dirs = [ROOT / PREFIX / name]

    @classmethod
    def create(cls, mode: str | None, name: str, memory_mb: int, max_tasks: int,
               cpu_quota: float | None = None):
        """A new cgroup, or None; ``cpu_quota`` (CPUs) is applied only where ``detect_cpu``
        found the controller (pass None otherwise)."""
        if mode is None:
            return None
        cg = cls(mode, name, cpu=cpu_quota is not None)
        try:
            for d in cg.dirs:
                d.mkdir()
            limit = str(memory_mb * 1024 * 1024)
            quota = None if cpu_quota is None else max(1000, int(cpu_quota * CPU_PERIOD_US))
            if mode == "v1":
                (cg.dirs[0] / "pids.max").write_text(str(max_tasks))
                (cg.dirs[1] / "memory.limit_in_bytes").write_text(limit)
                if quota is not None:
                    (cg.dirs[2] / "cpu.cfs_period_us").write_text(str(CPU_PERIOD_US))
                    (cg.dirs[2] / "cpu.cfs_quota_us").write_text(str(quota))
            else:
                (cg.dirs[0] / "pids.max").write_text(str(max_tasks))
                (cg.dirs[0] / "memory.max").write_text(limit)
                swap = cg.dirs[0] / "memory.swap.max"
                if swap.exists():
                    swap.write_text("0")
                if quota is not None:
                    (cg.dirs[0] / "cpu.max").write_text(f"{quota} {CPU_PERIOD_US}")
        except OSError:
            cg.remove()
            return None
        return cg

    def add(self, pids) -> bool:
        ok = True
        for d in self.dirs:
            for pid in pids:
                try:
                    (d / "cgroup.procs").write_text(str(pid))
                except OSError:
                    ok = False
        return ok

    def pids(self) -> set[int]:
        found: set[int] = set()
        for d in self.dirs:
            try:
                found.update(int(x) for x in (d / "cgroup.procs").read_text().split())
            except (OSError, ValueError):
                pass
        return found

    def kill(self) -> None:
        if self.mode == "v2" and (self.dirs[0] / "cgroup.kill").exists():
            try:
                (self.dirs[0] / "cgroup.kill").write_text("1")
            except OSError:
                pass
        for pid in self.pids():
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass

    def remove(self, wait: float = 1.0) -> bool:
        """Kill what is left and remove the directories; True when none remain."""
        deadline = time.monotonic() + wait
        for d in self.dirs:
            while d.exists():
                try:
                    d.rmdir()
                except FileNotFoundError:
                    break
                except OSError:
                    if time.monotonic() > deadline:
                        return False
                    self.kill()
                    time.sleep(0.002)
        return True


def cpu_dir(name: str) -> Path:
    """A worker's v1 cpu cgroup, directly below the hierarchy's root. Below one shared parent,
    all workers together would weigh what one process weighs (``cpu.shares`` is split
    hierarchically), and on a busy host the whole pool would get one process's share. At the
    top each worker weighs what it did without a controller. (On cgroup v2 the quota lives in the worker's one cgroup below ``spadekit``,
    which has the default ``cpu.weight``.)"""
    return ROOT / "cpu" / f"{PREFIX}-{name}"


def sweep_stale(mode: str | None) -> int:
    """Remove cgroups left by spadekit processes that no longer exist; returns how many."""
    if mode is None:
        return 0
    parents = ([ROOT / "pids" / PREFIX, ROOT / "memory" / PREFIX,
                ROOT / "cpu" / PREFIX]  # (where an earlier version kept cpu cgroups)
               if mode == "v1" else [ROOT / PREFIX])
    removed = 0
    if mode == "v1" and (ROOT / "cpu").is_dir():
        for d in (ROOT / "cpu").glob(f"{PREFIX}-*"):
            owner = d.name.split("-")[1]
            if d.is_dir() and owner.isdigit() and not Path(f"/proc/{owner}").exists():
                cg = WorkerCgroup(mode, d.name)
                cg.dirs = [d]
                cg.kill()
                removed += cg.remove(wait=0.5)
    for parent in parents:
        if not parent.is_dir():
            continue
        for d in parent.iterdir():
            if not d.is_dir():
                continue
            owner = d.name.split("-")[0]
            if owner.isdigit() and not Path(f"/proc/{owner}").exists():
                cg = WorkerCgroup(mode, d.name)
                cg.dirs = [d]
                cg.kill()
                removed += cg.remove(wait=0.5)
    return removed
