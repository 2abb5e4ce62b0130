"""The process that ``test_no_orphans.py`` SIGKILLs: real play on real sandboxes, then a ready
line, then play (or idling) until it is killed.

    python orphan_child.py local TIER play|idle     a local sandbox pool's env backend
    python orphan_child.py ray TIER play|idle       the Ray env backend (this process starts Ray)
    python orphan_child.py local TIER churn         sandboxes acquired, played and released in
        a loop while the pool boots spares: killed, it may be inside any step of a worker's life
    python orphan_child.py selfplay RUN_DIR ROUNDS KILL_ROUND
        a tiny self-play run (``benchmarks/chaos.py``'s) on the Ray env backend; in round
        KILL_ROUND, before its first step call, the Ray env worker hosting the first episode
        is SIGKILLed (``{"killed": pid, "slot": k}``); ``{"done": step}`` after each round.

    python orphan_child.py reaper FAKE_RAY_DIR close|hang
        ``spadekit.rollout.ray_reaper`` alone: a watchdog, then a fake Ray process (a script
        under FAKE_RAY_DIR, exec'd a moment after its start) with a child of its own in another
        session that ignores SIGTERM,
        and a process that is not Ray's; ``close`` closes the watchdog after the ready line
        (``{"closed": seconds}``), ``hang`` waits to be killed.

``play``: the ready line comes after the first steps, and steps go on without a pause.
``idle``: the ready line comes once every sandbox process is stopped by the pool's idle stop
(``sandbox.idle_stop_ms``), and nothing more happens. The ready line is one JSON object:
``{"ready": pid, "sandboxes": [pid, ...]}``.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

LOOP = '''
class Loop{n}Env:
    """Never ends: every step answers again."""

    def reset(self, seed=None, options=None):
        return "go", {{}}

    def step(self, action):
        return "again {n}", 0.0, False, False, {{}}
'''


def state(pid: int) -> str | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            stat = fh.read()
    except OSError:
        return None
    return stat[stat.rindex(b")") + 2:].split()[0].decode()


def start_time(pid: int) -> int | None:
    """The start time of a live (not zombie) ``pid``, or None."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            stat = fh.read()
    except OSError:
        return None
    fields = stat[stat.rindex(b")") + 2:].split()
    return None if fields[0] in (b"Z", b"X") else int(fields[19])


def descendants(pid: int) -> list[int]:
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        try:
            tids = os.listdir(f"/proc/{p}/task")
        except OSError:
            continue
        for tid in tids:
            try:
                with open(f"/proc/{p}/task/{tid}/children") as fh:
                    kids = [int(c) for c in fh.read().split()]
            except OSError:
                continue
            out += kids
            todo += kids
    return out


def wait_stopped(pids: list[int], timeout: float = 60.0) -> None:
    end = time.monotonic() + timeout
    while any(state(p) not in ("T", "t", None) for p in pids):
        if time.monotonic() > end:
            raise SystemExit(f"sandbox processes not stopped: {[(p, state(p)) for p in pids]}")
        time.sleep(0.05)


def envs(kind: str, tier: str, mode: str) -> None:
    from spadekit.rollout.ray_envs import make_env_backend
    from spadekit.sandbox import SandboxConfig, SandboxPool

    config = SandboxConfig(tier=tier, step_timeout=5.0, reset_timeout=5.0, load_timeout=10.0)
    warm = 0 if mode == "idle" else 1  # warm spares never had a request: not idle-stopped
    if mode == "churn":
        churn(SandboxPool(config, warm=2))
    if kind == "local":
        pool = SandboxPool(config, warm=warm)
        backend = make_env_backend("local", pool=pool)
    else:
        backend = make_env_backend("ray", config, num_workers=2, warm=warm,
                                   init_options={"num_cpus": 2, "log_to_driver": False})
    session = backend.session()
    items = [(f"{n:064x}", LOOP.format(n=n), None, n) for n in range(4)]
    started = session.start(items)
    handles = [s[0] for s in started if not isinstance(s, Exception)]
    if len(handles) != len(items):
        raise SystemExit(f"episodes did not start: {started}")
    for _ in range(3):
        session.step([(h, "x") for h in handles])
    if kind == "local":
        sandboxes = sorted(p for sb in pool.sandboxes() for p in sb.worker.host_pids)
    else:
        actors = [info["pid"] for info in backend.workers_info()]
        sandboxes = sorted(p for a in actors for p in descendants(a))
    if mode == "idle":
        wait_stopped(sandboxes)
    print(json.dumps({"ready": os.getpid(), "sandboxes": sandboxes}), flush=True)
    while mode == "play":
        session.step([(h, "x") for h in handles])
    while True:
        time.sleep(1.0)


def churn(pool) -> None:
    """Start, play and kill sandboxes without end (the pool boots spares meanwhile)."""
    n, ready = 0, False
    while True:
        sb = pool.acquire(LOOP.format(n=n % 3))
        env = sb.new_env()
        env.reset(seed=n)
        env.step("x")
        live = sorted(p for s in pool.sandboxes() for p in s.worker.host_pids)
        pool.release(sb)
        n += 1
        if n >= 3 and not ready:
            ready = True
            print(json.dumps({"ready": os.getpid(), "sandboxes": live}), flush=True)


def selfplay(run_dir: str, rounds: int, kill_round: int) -> None:
    import chaos
    from spadekit.policy.registry import load_policy
    from spadekit.policy.scripted import ScriptedPolicy
    from spadekit.selfplay.loop import SelfPlay

    policy = load_policy("tiny", seed=0)
    designer = ScriptedPolicy(policy.tokenizer, lambda _ids, text: chaos.designer_text(text))
    resume = (Path(run_dir) / "run.sqlite").exists()
    extra = ["distributed.env_backend=ray", "distributed.env_workers=2"]
    with SelfPlay(chaos.run_config(rounds, extra), run_dir, policy=policy,
                  designer_policy=designer, resume=resume) as sp:
        backend = sp.env_backend
        opened = backend.session
        killed: list[int] = []

        def session():
            s = opened()
            if sp.next_step != kill_round or killed:
                return s
            step = s.step

            def step_after_a_death(pairs):
                if not killed and pairs:
                    slot = pairs[0][0].slot
                    pid = backend.workers_info()[slot]["pid"]
                    below = {p: start_time(p) for p in descendants(pid)}  # its sandboxes
                    os.kill(pid, signal.SIGKILL)
                    end = time.monotonic() + 30
                    while state(pid) not in (None, "Z", "X") and time.monotonic() < end:
                        time.sleep(0.02)
                    while time.monotonic() < end and any(
                            start_time(p) == t for p, t in below.items()):
                        time.sleep(0.05)
                    killed.append(pid)
                    print(json.dumps({"killed": pid, "slot": slot, "sandboxes": sorted(below),
                                      "left": sorted(p for p, t in below.items()
                                                     if start_time(p) == t)}), flush=True)
                return step(pairs)

            s.step = step_after_a_death
            return s

        backend.session = session
        while sp.next_step < rounds:
            sp.round(sp.next_step)
            print(json.dumps({"done": sp.next_step}), flush=True)
            sp.next_step += 1


AGENT = """
import signal, subprocess, sys, time
kid = subprocess.Popen([sys.executable, "-c", "import signal, time\\n"
                        "signal.signal(signal.SIGTERM, signal.SIG_IGN)\\ntime.sleep(600)"],
                       start_new_session=True)
print(kid.pid, flush=True)
time.sleep(600)
"""


def reaper(fake_ray_dir: str, mode: str) -> None:
    import subprocess

    from spadekit.rollout.ray_reaper import POLL_S, RayReaper

    watchdog = RayReaper.start(fake_ray_dir)
    script = Path(fake_ray_dir) / "agent.py"
    script.write_text(AGENT)
    # runs something else first and only then the fake Ray program, as a fork does before its
    # exec (Ray's processes showed the driver's command line for a moment)
    late = ("import os, sys, time\ntime.sleep(%r)\n"
            "os.execv(sys.executable, [sys.executable, os.environ['FAKE_RAY_AGENT']])"
            % (POLL_S * 4))
    agent = subprocess.Popen([sys.executable, "-c", late], stdout=subprocess.PIPE, text=True,
                             env={**os.environ, "FAKE_RAY_AGENT": str(script)})
    kid = int(agent.stdout.readline())
    other = subprocess.Popen(["sleep", "600"])
    time.sleep(POLL_S * 8)  # the watchdog has looked below this process since
    procs = {"agent": agent.pid, "kid": kid, "other": other.pid, "watchdog": watchdog.pid}
    print(json.dumps({"ready": os.getpid(), **procs,
                      "starts": {k: start_time(p) for k, p in procs.items()}}), flush=True)
    if mode == "close":
        t = time.monotonic()
        watchdog.close()
        print(json.dumps({"closed": time.monotonic() - t, "rc": watchdog.proc.returncode}),
              flush=True)
    while True:
        time.sleep(1.0)


if __name__ == "__main__":
    if sys.argv[1] == "reaper":
        reaper(sys.argv[2], sys.argv[3])
    elif sys.argv[1] == "selfplay":
        selfplay(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
    else:
        envs(sys.argv[1], sys.argv[2], sys.argv[3])
