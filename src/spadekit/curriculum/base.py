"""The curriculum interface: which environments the agent plays each round, and what it learns from
the results. SPADE's designer pool, a fixed pool and RLVE's ladder implement it, so the three
settings share one trainer, loss and budget.

A curriculum is deterministic given its ``random.Random``; its state round-trips through
``state_dict()``/``load_state_dict()`` (JSON-safe) inside each round's transaction. Every
``EpisodeSpec`` it returns carries in ``tag``: ``env`` (the GRPO group key), ``skill``,
``with_hint`` (False) and ``designed`` (False).
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
