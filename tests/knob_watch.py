"""The knob-walk observer of ``watch.*`` (``tests/selfplay/test_config_knobs.py``): one round of the pool
watch on a real run database and real sandboxes, with a program that any garbage wins and a
program whose steps sleep 0.2 s against the 0.5 ms validation recorded for it."""

from __future__ import annotations

from typing import Any

from spadekit.common.streams import RoundStreams
from spadekit.selfplay.config import SelfPlayConfig
from spadekit.envs.program import EnvProgram

ANYTHING_WINS = r'''
class AnythingWinsEnv:
    def __init__(self, max_turns=12, **kwargs):
        self.max_turns = max_turns

    def reset(self, seed=None, options=None):
        return "Say anything.", {}

    def step(self, action):
        return "You win.", 1.0, True, False, {}
'''
SLOW = r'''
import time


class SlowEnv:
    def __init__(self, max_turns=12, **kwargs):
        self.max_turns = max_turns

    def reset(self, seed=None, options=None):
        self.t = 0
        return "Guess.", {}

    def step(self, action):
        self.t += 1
        time.sleep(0.2)  # wall clock, not a CPU loop: as slow on a fast runner as here
        return "Hm.", 0.25, self.t >= 2, False, {}
'''


def watch(cfg: SelfPlayConfig, w: Any) -> Any:
    """``{class name: retirement reason}`` after one watched round with no plays."""
    from spadekit.runs.store import RunStore
    from spadekit.selfplay.watch import PoolWatch

    with RunStore(w.fresh(), create=True) as store:
        names = {}
        for code in (ANYTHING_WINS, SLOW):
            program = EnvProgram(code=code)
            names[program.sha256] = code.split("class ")[1].split(":")[0]
            store.add_environment(program, step=0, validation={
                "ok": True, "details": {"step_ms": {"calls": 10, "p50": 0.5}}})
        retired, _metrics = PoolWatch(cfg.watch, store, {}, w.pool, 2, False).after_play(
            0, [], RoundStreams(0, 0))
        return {names[sha]: store.blacklist_reason(sha) for sha in sorted(retired)}
