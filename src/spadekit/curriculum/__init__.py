"""Curricula: which environments the agent plays each round (see ``base.Curriculum``).

Layer 5: curriculum.
May import: common, envs, sandbox, runs, policy, rollout.

=========  ========================================================================
``spade``  the designer writes the pool (``spadekit.selfplay.design`` inside ``selfplay``)
``fixed``  a static pool: the library, a ``spadekit generate`` pool, or a run's programs
``rlve``   RLVE's 400 packaged environments with per-environment difficulty ladders
=========  ========================================================================
"""

from __future__ import annotations

from typing import Any

from spadekit.curriculum.base import Curriculum
from spadekit.common.errors import ConfigError

KINDS = ("spade", "fixed", "rlve")

__all__ = ["KINDS", "Curriculum", "build_curriculum"]


def build_curriculum(config: Any) -> Curriculum | None:
    """The baseline curriculum a ``SelfPlayConfig`` asks for; None for SPADE itself."""
    c = config.curriculum
    if c.kind == "spade":
        return None
    if c.kind == "fixed":
        from spadekit.curriculum.fixed import FixedPoolCurriculum
        from spadekit.runs.sources import load_programs

        return FixedPoolCurriculum(load_programs(c.pool, config.setting))
    if c.kind == "rlve":
        if config.setting != "games":
            raise ConfigError("the rlve curriculum has single-turn reasoning problems: use "
                              "setting=games")
        from spadekit.curriculum.rlve import RLVECurriculum

        return RLVECurriculum(c.rlve_envs, threshold=c.rlve_threshold,
                              window_factor=c.rlve_window_factor, levels=c.rlve_levels)
    raise ConfigError(f"curriculum.kind must be one of {', '.join(KINDS)}, got {c.kind!r}")
