"""The per-round budgets a config implies (``spadekit selfplay --dry-run``): pool size, plays,
agent samples, hinted plays, the designer's loss weight, the turn cap, the token budgets, and
the checkpoints kept at most with their disk bound (``spadekit.selfplay.checkpoints``)."""

from __future__ import annotations

from typing import Any

from spadekit.selfplay.advantages import designer_weight
from spadekit.selfplay.checkpoints import checkpoint_budget, parameters_from_name
from spadekit.selfplay.config import CHAT_ROLES, SelfPlayConfig

__all__ = ["budgets"]


def budgets(config: SelfPlayConfig) -> dict[str, Any]:
    """The per-round sizes ``config`` leads to when every designed environment is valid: the
    pool (``envs_per_round`` designed plus ``bootstrap_per_round`` reference environments when
    a bootstrap is set), the no-hint plays of each (``plays_per_env``), the agent samples, the
    hinted plays of a new environment and the designer's loss weight
    ``min(n_agent / n_designer * regen_interval, cap)`` (agent samples counted as episodes:
    with ``train.sample_granularity=turn`` the loop counts turns, a larger weight). Fewer
    valid environments mean more plays each under ``agent_samples_per_round`` (the total stays
    put). ``env_max_turns`` is the
    episode cap of the designer's prompt, the validator and play (``turn_cap``)."""
    bootstrap = config.bootstrap_per_round if config.bootstrap else 0
    designed = config.envs_per_round if config.curriculum.kind == "spade" else 0
    pool = designed + bootstrap if config.curriculum.kind == "spade" else config.envs_per_round
    plays = config.plays_per_env(pool)
    n_agent = plays * pool
    weight = (designer_weight(n_agent, designed, config.regen_interval,
                              config.reward.designer_weight_cap) if designed else 0.0)
    return {
        "setting": config.setting, "model": config.model, "curriculum": config.curriculum.kind,
        "rounds": config.rounds, "regen_interval": config.regen_interval,
        "envs_per_round": config.envs_per_round, "pool_size": pool,
        "agent_samples_per_round": n_agent,
        "plays_per_env": plays,
        "hint_plays": config.hint_generations if designed else 0,
        "designer_samples_per_regen": designed,
        "designer_weight": weight,
        "designer_weight_cap": config.reward.designer_weight_cap,
        "env_max_turns": config.turn_cap,  # min(env_max_turns, rollout.max_turns)
        "rollout_max_turns": config.rollout.max_turns,
        "agent_max_new_tokens": config.rollout.max_new_tokens,
        "designer_max_new_tokens": config.designer.max_new_tokens,
        "hint_max_new_tokens": config.designer.hint_max_new_tokens,
        "max_context_tokens": config.rollout.max_context_tokens,
        "chat_template_kwargs": {role: config.chat_template.for_role(role)
                                 for role in CHAT_ROLES},
        "total_agent_samples": n_agent * config.rounds,
        **checkpoint_budget(config, parameters_from_name(config.model)),
    }
