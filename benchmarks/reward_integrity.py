"""What the designer-reward integrity checks of issue 22 cost, each against a baseline measured in
this same run.

- lockstep step with per-instance random streams: 8 instances of a reference-style program
  (``random.seed(seed)`` in ``reset``, the module's ``random`` in ``step``) stepped in lockstep in
  one worker, against the same program whose step draws nothing (the worker switches streams
  for both, so this is what drawing through an instance's own stream costs on top; the switch
  itself was measured against the previous worker when it was written: 8 instances in
  lockstep at 1.1-1.2x the old per-step time): ``per_instance_random_step_ratio``, three
  alternated measurements of each;
- validation of the reference library's programs: the full contract (solution on drawn seeds,
  garbage and random-policy baselines, a lockstep batch of ``lockstep_instances``, decoys)
  against the old contract's shape (no solution required, one instance at a time, no decoys):
  ``validation_vs_light_ratio`` and programs per second for both;
- the blind-reply baseline (each printed action replied every turn, other seeds' solutions, on
  ``blind_episodes`` drawn seeds) on the library's games and one procedural kit program of
  every ninth composition: full validation against the same with ``blind_episodes=0``,
  alternated three times: ``blind_baseline_ratio``;
- the hint-leak check (literal, then the empirical probe in the sandbox) per hint, against
  ``parse_hint`` on the same hint (the cost a hint had before): ``leak_check_ms_per_hint``.

Usage: python benchmarks/reward_integrity.py [--steps N]. The last line is one JSON object.
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
from spadekit.sandbox import SandboxPool  # noqa: E402
from spadekit.sandbox.batch import step_many  # noqa: E402
from spadekit.sandbox.validate import Validator, ValidatorSettings  # noqa: E402

REFSTYLE = '''
import random


class DiceEnv:
    def __init__(self, max_turns=100000, **kwargs):
        self.max_turns = max_turns

    def reset(self, seed=None, options=None):
        random.seed(seed)
        return "roll", {}

    def step(self, action):
        DRAW
        return "ok", 0.0, False, False, {}
'''


def lockstep_step_us(pool: SandboxPool, code: str, steps: int, instances: int = 8) -> float:
    """p50 microseconds per episode step, ``instances`` episodes stepped together."""
    sb = pool.acquire(code)
    try:
        envs = [sb.new_env() for _ in range(instances)]
        for i, env in enumerate(envs):
            env.reset(seed=i)
        times = []
        for _ in range(steps):
            t = time.perf_counter()
            step_many([(env, "\\boxed{go}") for env in envs])
            times.append((time.perf_counter() - t) / instances)
        return statistics.median(times) * 1e6
    finally:
        pool.release(sb)


def validations(pool: SandboxPool, settings: ValidatorSettings, programs: list) -> float:
    """Seconds per program, validated one after another (a fixed validation seed each)."""
    validator = Validator(pool, settings)
    t = time.perf_counter()
    reports = [validator.validate(p, seed=i) for i, p in enumerate(programs)]
    elapsed = time.perf_counter() - t
    bad = [(p.source, r.reason) for p, r in zip(programs, reports) if not r.ok]
    if bad and settings.require_solution:
        raise SystemExit(f"library programs failed the full contract: {bad}")
    return elapsed / len(programs)


def kit_programs() -> list:
    """One procedural kit program of every ninth composition (20), on fixed theme words."""
    from spadekit.envs.procedural.compose import all_combos
    from spadekit.envs.procedural.kit import compose_kit

    words = ("amber river lantern copper meadow falcon harbor velvet orchard glacier canyon "
             "thistle").split()
    return [compose_kit(combo, words, 1, 8) for combo in all_combos()[::9]]


def leak_check_ms(pool: SandboxPool, programs: list) -> tuple[float, float]:
    """(ms per hint for the literal + empirical check, ms per hint for parse_hint alone)."""
    from spadekit.selfplay.generate import solution_actions
    from spadekit.selfplay.leak_probe import empirical_leak
    from spadekit.selfplay.leaks import leaked_fragments
    from spadekit.selfplay.prompts import parse_hint

    checked, parsed = [], []
    for p in programs:
        trace = solution_actions(pool, p.code, 12)
        t = time.perf_counter()
        leaked_fragments(p.hint or "", trace or [])
        empirical_leak(pool, p.code, p.hint or "", solution=trace)
        checked.append(time.perf_counter() - t)
        t = time.perf_counter()
        parse_hint(p.hint)
        parsed.append(time.perf_counter() - t)
    return statistics.median(checked) * 1e3, statistics.median(parsed) * 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=400)
    args = ap.parse_args()
    programs = [library.program(e) for e in library.list_library() if e.setting == "games"]
    out: dict = {}
    with SandboxPool(warm=2) as pool:
        draws, plain = [], []
        for _ in range(3):  # alternated, so a busy moment hits both
            draws.append(lockstep_step_us(pool, REFSTYLE.replace("DRAW", "random.randint(1, 6)"),
                                          args.steps))
            plain.append(lockstep_step_us(pool, REFSTYLE.replace("DRAW", "pass"), args.steps))
        with_draw, without = statistics.median(draws), statistics.median(plain)
        out["lockstep_step_us_random"] = round(with_draw, 1)
        out["lockstep_step_us_no_random"] = round(without, 1)
        out["per_instance_random_step_ratio"] = round(with_draw / without, 3)
        full = validations(pool, ValidatorSettings(), programs)
        light = validations(pool, ValidatorSettings(require_solution=False, lockstep_instances=1,
                                                    decoy_instances=0, solution_drawn_seeds=0),
                            programs)
        out["validation_s_full"] = round(full, 3)
        out["validation_s_light"] = round(light, 3)
        out["validations_per_s_full"] = round(1 / full, 2)
        out["validation_vs_light_ratio"] = round(full / light, 2)
        kit = kit_programs()
        with_const, without_const = [], []
        for _ in range(3):  # alternated, so a busy moment hits both
            with_const.append(validations(pool, ValidatorSettings(), programs + kit))
            without_const.append(validations(pool, ValidatorSettings(blind_episodes=0),
                                             programs + kit))
        out["validation_s_blind_16"] = round(statistics.median(with_const), 3)
        out["validation_s_blind_0"] = round(statistics.median(without_const), 3)
        out["blind_baseline_ratio"] = round(statistics.median(with_const)
                                               / statistics.median(without_const), 3)
        checked, parsed = leak_check_ms(pool, programs)
        out["leak_check_ms_per_hint"] = round(checked, 2)
        out["parse_hint_ms_per_hint"] = round(parsed, 4)
    for key, value in out.items():
        print(f"{key:34s} {value}")
    print(json.dumps(out))


if __name__ == "__main__":
    main()
