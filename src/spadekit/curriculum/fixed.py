"""The fixed-environment baseline (SPEC "Baselines"): the agent trains on a static pool of
programs (the paper: 7,872 generated games), with SPADE's own trainer, loss and budget.

Each round plays ``envs`` programs, ``num_generations`` times each, in the sandbox. Programs are
visited in epochs: a shuffled order of the whole pool is walked front to back, so every program
is played once before any is played twice; the order and the position in it are the state.
"""

from __future__ import annotations

import random
from typing import Any, Sequence

from spadekit.curriculum.base import Curriculum
from spadekit.envs.program import EnvProgram
from spadekit.common.errors import ConfigError
from spadekit.rollout.engine import EpisodeSpec, Trajectory


class FixedPoolCurriculum(Curriculum):
    name = "fixed"

    def __init__(self, programs: Sequence[EnvProgram]):
        self.programs = {p.sha256: p for p in programs}
        if not self.programs:
            raise ConfigError("the fixed pool holds no programs")
        self.order: list[str] = []
        self.pos = 0
        self.epoch = 0

    def _next(self, rng: random.Random) -> str:
        if self.pos >= len(self.order):
            self.order = sorted(self.programs)
            rng.shuffle(self.order)
            self.pos = 0
            self.epoch += 1
        sha = self.order[self.pos]
        self.pos += 1
        return sha

    def episodes(self, step: int, rng: random.Random, envs: int,
                 num_generations: int) -> list[EpisodeSpec]:
        chosen: list[str] = []
        for _ in range(min(envs, len(self.programs))):
            sha = self._next(rng)
            if sha in chosen:  # the epoch wrapped inside this round: take the next one
                sha = self._next(rng)
            chosen.append(sha)
        specs = []
        for sha in chosen:
            program = self.programs[sha]
            tag = {"env": sha, "skill": program.skill, "with_hint": False, "designed": False}
            for _ in range(num_generations):
                specs.append(EpisodeSpec(program, seed=rng.randrange(2 ** 31), tag=dict(tag)))
        return specs

    def observe(self, step: int, trajectories: list[Trajectory]) -> dict[str, float]:
        return {"fixed/epoch": float(self.epoch),
                "fixed/epoch_progress": self.pos / max(1, len(self.order))}

    def state_dict(self) -> dict[str, Any]:
        return {"order": list(self.order), "pos": self.pos, "epoch": self.epoch}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        order = [s for s in state.get("order", []) if s in self.programs]
        if len(order) != len(state.get("order", [])):
            raise ConfigError("the fixed pool changed since this run started: its saved order "
                              "names programs the pool no longer holds")
        self.order, self.pos = order, int(state.get("pos", 0))
        self.epoch = int(state.get("epoch", 0))
