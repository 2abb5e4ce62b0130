"""The curriculum interface: which environments the agent plays each round, and what it learns
from the results. SPADE's designer-driven pool, a fixed pool and RLVE's adaptive-difficulty ladder
are three implementations, so ``selfplay`` runs the paper's three settings with one trainer, one
loss and the same budget (``envs_per_round`` environments x ``num_generations`` plays a round).

A curriculum is deterministic given the ``random.Random`` it is handed, and its whole state
round-trips through ``state_dict()`` / ``load_state_dict()`` (JSON-safe), which the run store saves
inside each round's transaction: a resumed run continues the same ladder.

Every ``EpisodeSpec`` a curriculum returns carries in ``tag``:
``env`` (the GRPO group key: plays of one environment instance), ``skill`` (a reporting bucket),
``with_hint`` (False: baselines never see hints) and ``designed`` (False).
"""

from __future__ import annotations

import random
from abc import ABC, abstractmethod
from typing import Any

from spadekit.rollout.engine import EpisodeSpec, Trajectory


class Curriculum(ABC):
    name: str = ""

    @abstractmethod
    def episodes(self, step: int, rng: random.Random, envs: int,
                 num_generations: int) -> list[EpisodeSpec]:
        """Round ``step``'s plays: ``envs`` environments, each played ``num_generations`` times
        (one GRPO group per environment instance, all plays sharing its ``tag["env"]``)."""

    def observe(self, step: int, trajectories: list[Trajectory]) -> dict[str, float]:
        """Update from the round's finished plays; return metrics to log (numbers only)."""
        return {}

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pass
