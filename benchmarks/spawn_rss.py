"""What starting a sandbox worker costs a caller that holds a lot of memory (a trainer).

Usage: python3 benchmarks/spawn_rss.py [--memory-mb 2048] [--workers 40] [--repeats 3]

The caller first allocates and touches ``--memory-mb`` of memory (a stand-in for a model, its
optimizer state and activations). It then starts ``--workers`` strong-tier workers (each one
loads a program and answers ``reset``) two ways, alternately, ``--repeats`` times:

- **popen-user**: Python's ``Popen(user=..., group=..., extra_groups=[])`` changes the ids in
  the child, so Python must ``fork()`` the caller: every worker copies the caller's page tables,
  and the caller's next write to each page takes a fault.
- **setpriv** (the default, ``spadekit.sandbox.launch.as_user``): ``setpriv`` changes them, so
  Python starts the child with ``vfork()``.

After each batch the caller writes one byte in every page of its memory (what training does to
its tensors). Reported: wall seconds a worker, the caller's own kernel CPU a worker (fork and
write faults) and its minor page faults a worker. Medians; ratios are popen-user / setpriv.
Per-worker uids need root: without it the script says so and exits 0. The last line is one
JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

ECHO = '''
class EchoEnv:
    def reset(self, seed=None, options=None):
        return "ready", {}

    def step(self, action):
        return "ok", 0.0, True, False, {}
'''


def batch(pool, memory, workers: int) -> dict:
    """``workers`` workers started, used and closed, then the caller's memory written."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    t = time.perf_counter()
    for _ in range(workers):
        sb = pool.acquire(ECHO)
        sb.new_env().reset(seed=0)
        sb.close()
    memory[::4096] += 1  # one write a page, as a training step writes its tensors
    wall = time.perf_counter() - t
    after = resource.getrusage(resource.RUSAGE_SELF)
    return {"wall_ms": 1000 * wall / workers,
            "caller_sys_ms": 1000 * (after.ru_stime - usage.ru_stime) / workers,
            "caller_faults": (after.ru_minflt - usage.ru_minflt) / workers}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--memory-mb", type=int, default=2048)
    ap.add_argument("--workers", type=int, default=40)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()

    from spadekit.common.errors import SandboxError
    from spadekit.sandbox import SandboxConfig, SandboxPool, launch

    if os.geteuid() != 0:
        print("per-worker uids need root; nothing to compare")
        print(json.dumps({"skipped": "not root"}))
        return
    if launch.setpriv_path() is None:
        print("no setpriv on this machine: workers start through Popen(user=...) only")
        print(json.dumps({"skipped": "no setpriv"}))
        return
    try:
        pool = SandboxPool(SandboxConfig(tier="strong"), warm=0)
    except SandboxError as exc:
        print(f"the strong tier does not boot here: {exc}")
        print(json.dumps({"skipped": "no strong tier"}))
        return
    import numpy

    memory = numpy.ones(args.memory_mb * 2**20, dtype=numpy.uint8)  # touched: resident
    found = launch.setpriv_path
    runs: dict[str, list[dict]] = {"popen-user": [], "setpriv": []}
    try:
        for _ in range(args.repeats):
            for way in ("popen-user", "setpriv"):
                launch.setpriv_path = (lambda: None) if way == "popen-user" else found
                runs[way].append(batch(pool, memory, args.workers))
    finally:
        launch.setpriv_path = found
        pool.close()

    def med(way: str, key: str) -> float:
        return statistics.median(r[key] for r in runs[way])

    out: dict = {"memory_mb": args.memory_mb, "workers": args.workers, "repeats": args.repeats}
    for key in ("wall_ms", "caller_sys_ms", "caller_faults"):
        for way in runs:
            out[f"{way.replace('-', '_')}_{key}"] = round(med(way, key), 2)
        out[f"{key}_ratio"] = round(med("popen-user", key) / max(med("setpriv", key), 1e-9), 2)
        print(f"{key:>14}: popen-user {med('popen-user', key):9.2f}   setpriv "
              f"{med('setpriv', key):9.2f}   ratio {out[f'{key}_ratio']}")
    print(json.dumps(out))


if __name__ == "__main__":
    main()
