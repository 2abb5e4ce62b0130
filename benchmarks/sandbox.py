"""Sandbox benchmark: every figure is measured in this one run, against baselines run here too.

- in-process step: the program's class exec'd in this process (no isolation at all);
- bare pipe round trip: a plain child interpreter echoing JSON lines (no isolation, no checks);
  the target's baseline;
- same-codec pipe round trip: that child with the JSON calls the sandbox protocol uses on its
  hot path (a formatted request, the decoder's C scanner, one reusable C encoder), for
  information: against it, ``isolated_vs_same_codec_pipe_step_p50`` is what isolation and the
  reply checks cost on their own, with the codec difference taken out;
- isolated step: a real sandbox at the detected tier (p50, p99);
- cold start (boot a worker) vs warm-pool acquire (take a booted worker and load the program);
- validator throughput over the reference library, 2 programs at a time;
- aggregate steps/s with 1 and 2 workers driven from threads;
- CPU an idle worker burns while a thread its program started spins (share of one CPU over
  0.5 s without requests), with idle stopping (``idle_stop_ms``) on and off.

Usage: python benchmarks/sandbox.py [--steps N]. The last line is one JSON object.
Targets (issue 2): isolated step p50 <= 1.3x the bare pipe (not the same-codec one); warm
acquire p50 <= 5 ms; >= 20 validations/s on 2 cores; an idle worker with a spinning thread near
0 CPU.
"""

from __future__ import annotations

import argparse
import json
import json.encoder
import os
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from spadekit.envs import library  # noqa: E402
from spadekit.sandbox import Sandbox, SandboxConfig, SandboxPool  # noqa: E402
from spadekit.sandbox.validate import Validator  # noqa: E402

ECHO = '''
class EchoEnv:
    def __init__(self, max_turns=12):
        self.max_turns = max_turns
    def reset(self, seed=None, options=None):
        self.t = 0
        return "ready", {}
    def step(self, action):
        self.t += 1
        return "obs:" + action[:100], 0.5, False, False, {"t": self.t}
'''

PIPE_CHILD = r'''
import json, sys
out = sys.stdout.buffer
for line in sys.stdin.buffer:
    req = json.loads(line)
    out.write(json.dumps({"id": req["id"], "ok": True,
                          "result": ["obs:" + req["action"][:100], 0.5, False, False,
                                     {"t": req["id"]}]}).encode() + b"\n")
    out.flush()
'''

PIPE_CHILD_SAME_CODEC = r'''
import json, json.encoder, sys
out = sys.stdout.buffer
scan = json.JSONDecoder().scan_once
enc = json.encoder.c_make_encoder(None, None, json.encoder.encode_basestring_ascii, None, ":",
                                  ",", False, False, False)
for line in sys.stdin.buffer:
    req = scan(line.decode(), 0)[0]
    out.write("".join(enc({"id": req["id"], "ok": True,
                           "result": ["obs:" + req["action"][:100], 0.5, False, False,
                                      {"t": req["id"]}]}, 0)).encode() + b"\n")
    out.flush()
'''


def pct(values, q):
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


def time_calls(fn, n, warmup=50):
    for _ in range(warmup):
        fn()
    out = []
    for _ in range(n):
        t = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t)
    return out


def inprocess_step(n):
    ns: dict = {}
    exec(compile(ECHO, "echo", "exec"), ns)
    env = ns["EchoEnv"]()
    env.reset(seed=0)
    return time_calls(lambda: env.step("x" * 50), n)


class PipeChild:
    """The baseline: a plain child interpreter answering JSON lines over pipes."""

    def __init__(self, python: str, code: str = PIPE_CHILD) -> None:
        self.proc = subprocess.Popen([python, "-I", "-S", "-c", code],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        self.counter = iter(range(1 << 30))

    def step(self) -> None:
        self.proc.stdin.write(json.dumps({"id": next(self.counter), "op": "step",
                                          "action": "x" * 50}).encode() + b"\n")
        self.proc.stdin.flush()
        json.loads(self.proc.stdout.readline())

    def close(self) -> None:
        self.proc.kill()
        self.proc.wait()


class SameCodecPipeChild(PipeChild):
    """The baseline child and parent with the sandbox protocol's hot-path JSON calls."""

    scan = json.JSONDecoder().scan_once
    encode_str = json.encoder.encode_basestring_ascii

    def __init__(self, python: str) -> None:
        super().__init__(python, PIPE_CHILD_SAME_CODEC)

    def step(self) -> None:
        self.proc.stdin.write(b'{"id":%d,"op":"step","action":%s}\n' % (
            next(self.counter), self.encode_str("x" * 50).encode()))
        self.proc.stdin.flush()
        self.scan(self.proc.stdout.readline().decode(), 0)


def settle(pool, timeout=5.0):
    """Wait until the pool's background refill is done, so it does not disturb timings."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if len([s for s in pool.sandboxes() if s.program is None]) >= pool.warm:
            return
        time.sleep(0.005)


def pipe_vs_isolated(config, plan, n, block=250):
    """Alternate blocks of baseline and isolated steps so machine noise hits both alike.

    Both children and this process are pinned to one CPU for this part: on this virtual machine
    a wakeup across cores costs a variable 50-150 us (virtual IPIs), which would swamp the
    software overhead being compared. Pinning measures the overhead itself."""
    allowed = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {min(allowed)})
    try:
        child = PipeChild(plan.python)  # the workers' interpreter, so only isolation differs
        same = SameCodecPipeChild(plan.python)
        sb = Sandbox.start(config, plan)
    finally:
        os.sched_setaffinity(0, allowed)
    os.sched_setaffinity(0, {min(allowed)})
    sb.load(ECHO)
    env = sb.new_env()
    env.reset(seed=0)
    pipe, same_codec, iso = [], [], []
    try:
        time_calls(child.step, 100)
        time_calls(same.step, 100)
        time_calls(lambda: env.step("x" * 50), 100)
        for _ in range(max(1, n // block)):
            pipe += time_calls(child.step, block, warmup=5)
            iso += time_calls(lambda: env.step("x" * 50), block, warmup=5)
            same_codec += time_calls(same.step, block, warmup=5)
    finally:
        os.sched_setaffinity(0, allowed)
        child.close()
        same.close()
        sb.close()
    return pipe, iso, same_codec


SPINNER = '''
import threading
def spin():
    while True:
        pass
class SpinEnv:
    def reset(self, seed=None, options=None):
        threading.Thread(target=spin, daemon=True).start()
        return "spinning", {}
    def step(self, action):
        return "ok", 0.0, False, False, {}
'''


def cpu_of(pids) -> float:
    total = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as fh:
                fields = fh.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += int(fields[11]) + int(fields[12])
    return total / os.sysconf("SC_CLK_TCK")


def idle_cpu_share(config, plan, seconds=0.5) -> float:
    """Share of one CPU a worker uses between requests while its program's thread spins."""
    sb = Sandbox.start(config, plan)
    try:
        sb.load(SPINNER)
        env = sb.new_env()
        env.reset()
        env.step("x")
        before = cpu_of(sb.worker.host_pids)
        time.sleep(seconds)
        return (cpu_of(sb.worker.host_pids) - before) / seconds
    finally:
        sb.close()


def starts(pool, n):
    cold = []
    for _ in range(n):
        t = time.perf_counter()
        sb = Sandbox.start(pool.config, pool.plan)
        sb.load(ECHO)
        cold.append(time.perf_counter() - t)
        sb.close()
    warm = []
    for _ in range(n):
        settle(pool)
        t = time.perf_counter()
        sb = pool.acquire(ECHO)
        warm.append(time.perf_counter() - t)
        sb.close()
    return cold, warm


def validations(pool, rounds, workers):
    sources = [library.source(e.name) for e in library.list_library()] * rounds
    validator = Validator(pool)
    settle(pool)
    t = time.perf_counter()
    reports = validator.validate_many(sources, workers=workers)
    elapsed = time.perf_counter() - t
    bad = [r.reason for r in reports if not r.ok]
    return len(sources) / elapsed, bad


def steps_per_s(pool, workers, seconds=1.5):
    counts = [0] * workers
    stop = threading.Event()

    def drive(i):
        sb = pool.acquire(ECHO)
        env = sb.new_env()
        env.reset(seed=i)
        while not stop.is_set():
            env.step("x" * 50)
            counts[i] += 1
        sb.close()

    threads = [threading.Thread(target=drive, args=(i,)) for i in range(workers)]
    for th in threads:
        th.start()
    time.sleep(0.3)
    start = list(counts)
    t = time.perf_counter()
    time.sleep(seconds)
    done = list(counts)
    elapsed = time.perf_counter() - t
    stop.set()
    for th in threads:
        th.join()
    return sum(d - s for d, s in zip(done, start)) / elapsed


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=3000)
    ap.add_argument("--starts", type=int, default=15)
    ap.add_argument("--rounds", type=int, default=3, help="passes over the library")
    ap.add_argument("--workers", type=int, default=4, help="validations in flight at once")
    args = ap.parse_args()
    from spadekit.sandbox import detect

    config = SandboxConfig()
    _report, plan = detect(config)
    inproc = inprocess_step(args.steps)
    pipe, iso, same_codec = pipe_vs_isolated(config, plan, args.steps)
    pool = SandboxPool(config, warm=args.workers)
    try:
        cold, warm = starts(pool, args.starts)
        vps, bad = validations(pool, args.rounds, args.workers)
        sps1 = steps_per_s(pool, 1)
        sps2 = steps_per_s(pool, 2)
    finally:
        pool.close()
    idle_on = idle_cpu_share(config, plan)
    idle_off = idle_cpu_share(config.replace(idle_stop_ms=0), plan)
    us = 1e6
    result = {
        "tier": pool.report.tier,
        "cpus": os.cpu_count(),
        "inprocess_step_p50_us": round(statistics.median(inproc) * us, 2),
        "pipe_step_p50_us": round(statistics.median(pipe) * us, 1),
        "pipe_step_p99_us": round(pct(pipe, 0.99) * us, 1),
        "isolated_step_p50_us": round(statistics.median(iso) * us, 1),
        "isolated_step_p99_us": round(pct(iso, 0.99) * us, 1),
        "isolated_vs_pipe_step_p50": round(statistics.median(iso) / statistics.median(pipe), 3),
        "same_codec_pipe_step_p50_us": round(statistics.median(same_codec) * us, 1),
        "isolated_vs_same_codec_pipe_step_p50": round(statistics.median(iso) /
                                                      statistics.median(same_codec), 3),
        "isolated_vs_inprocess_step_p50": round(statistics.median(iso) /
                                                statistics.median(inproc), 1),
        "cold_start_p50_ms": round(statistics.median(cold) * 1e3, 2),
        "warm_acquire_p50_ms": round(statistics.median(warm) * 1e3, 2),
        "cold_vs_warm": round(statistics.median(cold) / statistics.median(warm), 1),
        "validations_per_s": round(vps, 1),
        "invalid_library_programs": bad,
        "steps_per_s_1_worker": round(sps1),
        "steps_per_s_2_workers": round(sps2),
        "idle_worker_cpu_share": round(idle_on, 3),
        "idle_worker_cpu_share_without_stopping": round(idle_off, 3),
    }
    for key, value in result.items():
        print(f"{key:34s} {value}")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
