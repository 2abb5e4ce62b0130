"""Cost of the reference-contract compatibility layer (``SandboxConfig.compat``, ``packages``).

Everything is measured in this one run, at the detected tier:

- plain programs (the reference library, which uses no compatibility feature): warm-pool
  acquire p50 (take a booted worker and load the program) and validations/s, with the layer off
  (``compat=False, packages=()``: the worker path as before issue 15) and on (the defaults);
  the two configurations alternate round by round so machine noise hits both alike;
- reference-style programs: warm acquire p50 and one validation's wall time for a program that
  uses only stdlib names without imports, one that reads ``np``, one that calls math_verify's
  ``verify``.

Usage: python benchmarks/compat.py [--rounds N] [--acquires N]. The last line is one JSON object.
Target: plain programs unchanged within noise (on/off ratio of the p50s near 1).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from spadekit.envs import library  # noqa: E402
from spadekit.sandbox import SandboxConfig, SandboxPool  # noqa: E402
from spadekit.sandbox.validate import Validator  # noqa: E402

REFSTYLE = Path(__file__).resolve().parents[1] / "tests" / "data" / "refstyle"
STDLIB_ONLY = (REFSTYLE / "game_00000_001_optimization.py").read_text()
WITH_NUMPY = '''
class NumpySumEnv:
    def __init__(self, max_turns=4, **kwargs):
        self.max_turns = max_turns
    def reset(self, seed=None):
        self.values = np.random.default_rng(seed).integers(1, 99, size=6)
        self.turn = 0
        return "Sum of %s? Reply \\\\boxed{n}." % self.values.tolist(), {}
    def step(self, action):
        self.turn += 1
        m = re.search(r"\\\\boxed\\{(\\d+)\\}", action)
        if m and int(m.group(1)) == int(self.values.sum()):
            return "Correct", 1.0, True, False, {}
        return "No", 0.0, False, self.turn >= self.max_turns, {}
'''
WITH_MATH_VERIFY = (REFSTYLE / "game_00000_000_mathematical_reasoning.py").read_text()


def settle(pool, timeout=10.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if len([s for s in pool.sandboxes() if s.program is None]) >= pool.warm:
            return
        time.sleep(0.005)


def warm_acquires(pool, code, n):
    times = []
    for _ in range(n):
        settle(pool)
        t = time.perf_counter()
        sb = pool.acquire(code)
        times.append(time.perf_counter() - t)
        sb.close()
    return times


def validations_per_s(pool, sources):
    validator = Validator(pool)
    settle(pool)
    t = time.perf_counter()
    reports = validator.validate_many(sources, workers=2)
    elapsed = time.perf_counter() - t
    return len(sources) / elapsed, [r.reason for r in reports if not r.ok]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--acquires", type=int, default=15)
    args = ap.parse_args()
    plain = [library.source(e.name) for e in library.list_library()]
    pools = {"off": SandboxPool(SandboxConfig(compat=False, packages=()), warm=2),
             "on": SandboxPool(SandboxConfig(), warm=2)}
    acquire = {k: [] for k in pools}
    rate = {k: [] for k in pools}
    bad = {k: set() for k in pools}
    try:
        for _ in range(args.rounds):
            for name, pool in pools.items():
                acquire[name] += warm_acquires(pool, plain[0], args.acquires)
                r, failed = validations_per_s(pool, plain)
                rate[name].append(r)
                bad[name].update(failed)
        styled = {}
        pool = pools["on"]
        for label, code in (("stdlib_names", STDLIB_ONLY), ("numpy", WITH_NUMPY),
                            ("math_verify", WITH_MATH_VERIFY)):
            times = warm_acquires(pool, code, max(3, args.acquires // 3))
            settle(pool)
            t = time.perf_counter()
            report = Validator(pool).validate(code)
            styled[label] = {"warm_acquire_p50_ms": round(statistics.median(times) * 1e3, 1),
                             "validation_ms": round((time.perf_counter() - t) * 1e3, 1),
                             "valid": report.ok}
    finally:
        for p in pools.values():
            p.close()
    out = {"tier": pools["on"].plan.tier}
    for name in pools:
        out[f"plain_warm_acquire_p50_ms_{name}"] = round(statistics.median(acquire[name]) * 1e3,
                                                         2)
        out[f"plain_validations_per_s_{name}"] = round(statistics.median(rate[name]), 1)
        out[f"plain_invalid_{name}"] = sorted(bad[name])
    out["plain_acquire_ratio_on_off"] = round(out["plain_warm_acquire_p50_ms_on"] /
                                              out["plain_warm_acquire_p50_ms_off"], 3)
    out["plain_validations_ratio_on_off"] = round(out["plain_validations_per_s_on"] /
                                                  out["plain_validations_per_s_off"], 3)
    out["reference_style"] = styled
    for key, value in out.items():
        if key != "reference_style":
            print(f"{key:34s} {value}")
    for label, row in styled.items():
        print(f"{label:34s} {row}")
    print(json.dumps(out))


if __name__ == "__main__":
    main()
