"""Does training make the model better? Held-out evaluation, a paired bootstrap interval, and a
minimal agent-only GRPO round, shared by the learning test and ``benchmarks/learning.py``.

``evaluate`` plays programs on held-out seeds (seeds that training never plays) and returns one
return per episode, in a fixed order, so two evaluations of the same seeds pair up episode by
episode. ``paired_gain_ci`` is a percentile bootstrap over those pairs of the after-minus-before
difference of the mean (a statistic such as the win rate goes through ``stat``). ``grpo_round``
is one round of the agent's side of the loop without a designer: play every program
``plays`` times on fresh training seeds, GRPO advantages within each program (SPEC point 6),
one update; it reports the share of samples with a non-zero advantage (a round whose groups
all tie has nothing to learn from).
"""

from __future__ import annotations

import random
from typing import Any, Callable, Sequence

from spadekit.selfplay.advantages import Sample, agent_advantages
from spadekit.rollout.engine import EpisodeSpec, RolloutEngine, Trajectory

HELD_OUT_BASE = 1_000_000
"""Held-out seeds start here; training seeds are drawn below it."""


def held_out_seeds(n: int, offset: int = 0) -> list[int]:
    return list(range(HELD_OUT_BASE + offset, HELD_OUT_BASE + offset + n))


def evaluate(engine: RolloutEngine, programs: Sequence[Any], seeds: Sequence[int]
             ) -> list[Trajectory]:
    """Every program on every seed, program-major; the trajectories in that order."""
    return engine.run([EpisodeSpec(p, seed=s, tag={"env": i})
                       for i, p in enumerate(programs) for s in seeds])


def mean(xs: Sequence[float]) -> float:
    return sum(xs) / len(xs) if xs else 0.0


def win_rate(xs: Sequence[float]) -> float:
    """Share of episodes with return > 0 (SPEC point 5's win)."""
    return mean([1.0 if x > 0 else 0.0 for x in xs])


def paired_gain_ci(before: Sequence[float], after: Sequence[float], *, resamples: int = 2000,
                   level: float = 0.95, seed: int = 0,
                   stat: Callable[[Sequence[float]], float] = mean) -> tuple[float, float, float]:
    """``(gain, low, high)``: ``stat(after) - stat(before)`` and its percentile bootstrap
    interval, resampling the paired episodes (the same held-out seed before and after)."""
    if len(before) != len(after) or not before:
        raise ValueError("paired_gain_ci needs two non-empty lists of the same length")
    rng = random.Random(seed)
    n = len(before)
    gains = []
    for _ in range(resamples):
        idx = [rng.randrange(n) for _ in range(n)]
        gains.append(stat([after[i] for i in idx]) - stat([before[i] for i in idx]))
    gains.sort()
    tail = (1 - level) / 2
    low = gains[int(tail * (resamples - 1))]
    high = gains[int((1 - tail) * (resamples - 1))]
    return stat(after) - stat(before), low, high


def grpo_round(engine: RolloutEngine, trainer: Any, programs: Sequence[Any], plays: int,
               seeds_per_program: int, rng: random.Random) -> dict[str, Any]:
    """One agent-only round: each program on ``seeds_per_program`` training seeds, ``plays``
    episodes each (a GRPO group per program and seed), then one update."""
    specs = []
    for i, program in enumerate(programs):
        for _ in range(seeds_per_program):
            seed = rng.randrange(HELD_OUT_BASE)
            specs += [EpisodeSpec(program, seed=seed, tag={"env": f"{i}:{seed}"})
                      for _ in range(plays)]
    trajs = engine.run(specs)
    returns: dict[str, list[float]] = {}
    for tr in trajs:
        returns.setdefault(str(tr.spec.tag["env"]), []).append(tr.episode_return)
    advs = agent_advantages(returns)
    samples, seen = [], {k: 0 for k in returns}
    for tr in trajs:
        key = str(tr.spec.tag["env"])
        adv = advs[key][seen[key]]
        seen[key] += 1
        if tr.num_sampled:
            samples.append(Sample(role="agent", group_id=key, token_ids=tr.token_ids,
                                  loss_mask=tr.loss_mask, behaviour_logprobs=tr.logprobs,
                                  advantage=adv))
    nonzero = sum(1 for s in samples if s.advantage != 0.0)
    stats = trainer.train_step(samples) if nonzero else {"loss": None, "seconds": 0.0}
    all_returns = [tr.episode_return for tr in trajs]
    return {"train_mean_return": mean(all_returns), "train_win_rate": win_rate(all_returns),
            "nonzero_advantage_share": nonzero / len(samples) if samples else 0.0,
            "samples": len(samples), "loss": stats.get("loss"),
            "update_seconds": stats.get("seconds", 0.0),
            "empty_update": "all groups tied" if samples and not nonzero else
            ("no sampled tokens" if not samples else None)}
