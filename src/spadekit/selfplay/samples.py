"""The per-role training samples of one self-play round (SPEC points 4-7).

- agent: GRPO advantages within each environment's no-hint plays (hint plays measure regret
  only); a crashed episode returns ``reward.failed_episode_reward``; one sample per episode, or
  per assistant turn (``train.sample_granularity=turn``);
- designer: the samples due now, rewarded by ``reward.signal`` with the round's ``config.reward``
  (so a schedule entry moves it), centred per skill, upweighted; each one's reward, advantage,
  weight, plateau input and window variance is recorded as a ``designer_samples`` event;
- the learning-potential trackers get each pooled environment's round win rate (``update_ema``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from spadekit.selfplay.advantages import (Sample, agent_advantages, designer_advantages, designer_weight,
                                 per_turn_samples)
from spadekit.selfplay.rewards import (EmaTracker, EnvStats, designer_signal, return_variance,
                                       win_rate)
from spadekit.rollout.engine import Trajectory
from spadekit.rollout.thinking import ends_inside_thinking

__all__ = ["agent_samples", "designer_samples", "env_stats", "round_win_rate", "update_ema"]


def agent_samples(trajs: list[Trajectory], config: Any, metrics: dict) -> list[Sample]:
    """GRPO within each environment's no-hint plays (hint plays measure regret only)."""
    fail = config.reward.failed_episode_reward
    groups: dict[str, list[Trajectory]] = {}
    for tr in trajs:
        if not tr.spec.tag["with_hint"] and tr.num_sampled:
            groups.setdefault(tr.spec.tag["env"], []).append(tr)
    returns = {env: [fail if t.failure else t.episode_return for t in group]
               for env, group in groups.items()}
    advs = agent_advantages(returns)
    samples = []
    per_turn = config.train.sample_granularity == "turn"
    for env, group in groups.items():
        for tr, adv in zip(group, advs[env]):
            if per_turn:  # one sample per assistant turn, the episode's advantage on each
                samples += per_turn_samples(tr, adv, role="agent", group_id=env,
                                            truncated=tr.truncated and not tr.terminated)
                continue
            samples.append(Sample(role="agent", group_id=env, token_ids=tr.token_ids,
                                  loss_mask=tr.loss_mask, behaviour_logprobs=tr.logprobs,
                                  advantage=adv, weight=1.0,
                                  truncated=tr.truncated and not tr.terminated))
    played = [r for rs in returns.values() for r in rs]
    metrics.update(agent_episodes=len(played),
                   agent_mean_return=sum(played) / len(played) if played else 0.0,
                   agent_win_rate=sum(r > 0 for r in played) / len(played) if played else 0.0,
                   agent_failures=sum(1 for t in trajs if t.failure),
                   sampled_tokens=sum(t.num_sampled for t in trajs),
                   **{"thinking_cut/agent": sum(
                       ends_inside_thinking(m.get("content") or "") for t in trajs
                       for m in t.messages if m.get("role") == "assistant")},
                   agent_samples_per_episode=len(samples) / len(played) if played else 0.0,
                   agent_nonzero_advantage_share=sum(s.advantage != 0 for s in samples)
                   / len(samples) if samples else 0.0)
    return samples

def designer_samples(store: Any, memory: Any, ema: dict[str, EmaTracker], config: Any, step: int,
                     n_agent: int, metrics: dict) -> list[Sample]:
    """The designer samples due at ``step``: :func:`designer_rewards` then
    :func:`designer_samples_from` (the loop calls the two as its reward and advantage steps)."""
    return designer_samples_from(designer_rewards(store, memory, ema, config, step, metrics),
                                 store, config, step, n_agent, metrics)


@dataclass
class DueRewards:
    """The designer samples due this round and the reward of each (same order)."""

    due: list[dict] = field(default_factory=list)
    rewards: list[float] = field(default_factory=list)
    win_rates: list[float | None] = field(default_factory=list)
    """The window win rate of each; None for a fixed reward."""
    variances: list[float | None] = field(default_factory=list)
    """The variance of each window's no-hint returns (bimodal-hack monitor); None likewise."""
    plateau_inputs: list[float | None] = field(default_factory=list)
    """What the plateau read: the win rate, above chance with ``reward.above_chance``."""


def designer_rewards(store: Any, memory: Any, ema: dict[str, EmaTracker], config: Any, step: int,
                     metrics: dict) -> DueRewards:
    """SPEC points 4-5: the rewards of the designer samples due at ``step`` (written
    ``regen_interval`` rounds ago): the configured designer signal, or the fixed reward of an
    invalid or hanging program; the memory learns each environment's designer reward."""
    cfg = config
    due = store.pop_due(step)
    if not due:
        return DueRewards()
    rewards, regrets = [], []
    win_rates: list[float | None] = []
    variances: list[float | None] = []
    plateau_inputs: list[float | None] = []
    params = cfg.reward
    for item in due:
        meta = item.get("meta") or {}
        if "fixed_reward" in meta:
            rewards.append(float(meta["fixed_reward"]))
            win_rates.append(None)
            plateau_inputs.append(None)
            variances.append(None)
            continue
        stats = env_stats(store, ema, item["env_sha"])
        reward = designer_signal(cfg.reward.signal, stats, params)
        rewards.append(reward)
        win_rates.append(params.win_rate(stats.lifetime()))
        plateau_inputs.append(params.plateau_input(stats))
        variances.append(return_variance(stats.lifetime()))
        regret = store.env_stats(item["env_sha"])["regret_at_gen"]
        if regret is not None:
            regrets.append(regret)
        memory.refresh_from_store(item["env_sha"], designer_reward=reward, step=step)
    metrics.update(designer_reward=sum(rewards) / len(rewards),
                   regret=sum(regrets) / len(regrets) if regrets else 0.0)
    scored = [v for v in variances if v is not None]
    if scored:
        metrics["designer/win_rate_variance"] = sum(scored) / len(scored)
        metrics["designer/win_rate"] = sum(w for w in win_rates if w is not None) / len(scored)
        # what the plateau read: the win rate above chance with reward.above_chance
        metrics["designer/plateau_input"] = sum(w for w in plateau_inputs
                                                if w is not None) / len(scored)
    return DueRewards(due, rewards, win_rates, variances, plateau_inputs)


def designer_samples_from(scored: DueRewards, store: Any, config: Any, step: int, n_agent: int,
                          metrics: dict) -> list[Sample]:
    """SPEC points 6-7: the designer samples of ``scored``: rewards centred per skill, weighted
    by ``min(n_agent / n_designer * regen_interval, cap)``."""
    cfg, due, rewards = config, scored.due, scored.rewards
    if not due:
        return []
    by_skill: dict[str, list[int]] = {}
    for i, item in enumerate(due):
        by_skill.setdefault(item.get("skill") or "?", []).append(i)
    centred = designer_advantages({s: [rewards[i] for i in idx]
                                   for s, idx in by_skill.items()})
    weight = designer_weight(max(n_agent, 1), len(due), cfg.regen_interval,
                             cfg.reward.designer_weight_cap)
    samples, records = [], []
    for skill, idx in by_skill.items():
        for i, adv in zip(idx, centred[skill]):
            item = due[i]
            records.append({"sample_id": item.get("sample_id"), "env_sha": item.get("env_sha"),
                            "skill": skill, "generated_step": item.get("generated_step"),
                            "reward": rewards[i], "advantage": adv, "weight": weight,
                            "win_rate": _at(scored.win_rates, i),
                            "plateau_input": _at(scored.plateau_inputs, i),
                            "win_rate_variance": _at(scored.variances, i)})
            samples.append(Sample(role="designer", group_id=skill,
                                  token_ids=item["token_ids"], loss_mask=item["loss_mask"],
                                  behaviour_logprobs=item.get("logprobs"), advantage=adv,
                                  weight=weight, generated_at_step=item["generated_step"]))
    # one record per designer sample in the run database (events, kind designer_samples): what
    # each environment's program was rewarded, its centred advantage and its loss weight
    store.append_event({"kind": "designer_samples", "step": step, "signal": cfg.reward.signal,
                        "samples": records})
    metrics.update(designer_samples=len(samples), designer_weight=weight)
    return samples

def _at(values: list, i: int) -> Any:
    """``values[i]``, or None where a caller built ``DueRewards`` without that list."""
    return values[i] if i < len(values) else None


def env_stats(store: Any, ema: dict[str, EmaTracker], sha: str) -> EnvStats:
    """An environment's returns for the designer signal: with and without the hint at its
    creation step (regret, matched timing) and every no-hint play of its life (win rate)."""
    rows = store.query("SELECT episode_return, with_hint, step FROM plays "
                            "WHERE env_sha = ?", (sha,))
    env = store.get_environment(sha)
    created = env["created_step"]
    with_hint = [r[0] for r in rows if r[1] and r[2] == created]
    without = [r[0] for r in rows if not r[1] and r[2] == created]
    lifetime = [r[0] for r in rows if not r[1]]
    return EnvStats(returns_with_hint=with_hint or [0.0], returns_without_hint=without or
                    [0.0], lifetime_returns=lifetime or None, ema=ema.get(sha),
                    chance=chance_return(env))


def chance_return(env: dict[str, Any]) -> float:
    """The stored environment's chance return (its validation's ``chance_return``, clipped to
    [0, 1]); 0 where validation did not measure it (a program pooled without validation)."""
    details = (env.get("validation") or {}).get("details") or {}
    value = details.get("chance_return")
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value:
        return 0.0
    return min(1.0, max(0.0, float(value)))


def round_win_rate(store: Any, sha: str, step: int,
                   input: str = "mean_return") -> float | None:
    """The win rate (``rewards.win_rate`` of ``input``, ``reward.win_rate_input``: mean return
    by default) of the environment's no-hint plays of round ``step`` (None: it was not played
    without the hint that round)."""
    rows = store.query("SELECT episode_return FROM plays WHERE env_sha = ? AND step = ? "
                       "AND with_hint = 0", (sha, step))
    if not rows:
        return None
    return win_rate([r[0] for r in rows], input)


def update_ema(store: Any, ema: dict[str, EmaTracker], config: Any, sha: str,
               step: int) -> None:
    """Fold round ``step``'s win rate of ``sha`` into its learning-potential tracker (created on
    first use), with the round's ``reward.ema_*`` constants."""
    r = config.reward
    w = round_win_rate(store, sha, step, r.win_rate_input)
    if w is None:
        return
    tracker = ema.get(sha)
    if tracker is None:
        tracker = ema[sha] = r.ema()
    tracker.alpha_fast, tracker.alpha_slow, tracker.scale = r.ema_alpha_fast, r.ema_alpha_slow, \
        r.ema_scale
    tracker.update(w)
