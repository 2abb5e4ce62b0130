"""How many CPUs this process may really use, for sizing thread pools (torch, test workers).

``os.cpu_count()`` counts the host's cores: in a container limited to 2 CPUs on a 64-core host
it says 64, and 64 OpenMP threads then spin against each other on 2 CPUs' worth of time. The
count here is the affinity mask (``taskset``, ``docker --cpuset-cpus``), capped by the tightest
CPU quota of the cgroup and its ancestors (``docker --cpus``, a Kubernetes limit, a systemd
slice), rounded up.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

__all__ = ["cgroup_cpu_quota", "usable_cpus"]


def usable_cpus() -> int:
    """The CPUs this process may use: its affinity mask, capped by its cgroup's CPU quota (a
    container limited to 2 CPUs on a 64-core host has 2)."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cpus = os.cpu_count() or 1
    quota = cgroup_cpu_quota()
    return max(1, min(cpus, quota)) if quota else max(1, cpus)


def cgroup_cpu_quota() -> int | None:
    """CPUs' worth of the tightest CPU quota over this process's cgroup and its ancestors (v2
    ``cpu.max``, v1 ``cpu.cfs_quota_us``; a container's own files at the mount root count too),
    rounded up; None when unlimited or unknown. Never raises: odd files are skipped."""
    def v2(folder: Path) -> float | None:
        quota, period = (folder / "cpu.max").read_text().split()[:2]
        return None if quota == "max" or int(period) <= 0 else int(quota) / int(period)

    def v1(folder: Path) -> float | None:
        quota = int((folder / "cpu.cfs_quota_us").read_text())
        period = int((folder / "cpu.cfs_period_us").read_text())
        return quota / period if quota > 0 and period > 0 else None

    found: list[float] = []
    try:
        # a cgroup's name is bytes: one that is not UTF-8 must not stop a trainer from starting
        lines = Path("/proc/self/cgroup").read_text(errors="surrogateescape").splitlines()
    except (OSError, ValueError):
        lines = []
    mounts = [(v2, Path("/sys/fs/cgroup"))]
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _hier, controllers, path = parts
        if controllers == "":
            root, read = Path("/sys/fs/cgroup"), v2
        elif "cpu" in controllers.split(","):
            root, read = Path("/sys/fs/cgroup", controllers), v1
            if not root.exists():
                root = Path("/sys/fs/cgroup/cpu")
            mounts.append((v1, root))
        else:
            continue
        rel = [p for p in path.split("/") if p]
        if ".." in rel:  # outside this cgroup namespace: only the mount root below counts
            continue
        for depth in range(len(rel), 0, -1):  # the cgroup, then each ancestor
            mounts.append((read, root.joinpath(*rel[:depth])))
    for read, folder in mounts:
        try:
            cpus = read(folder)
        except (OSError, ValueError, IndexError):
            continue
        if cpus:
            found.append(cpus)
    return max(1, math.ceil(min(found))) if found else None
