"""Per-role advantages and the designer's loss weight (SPEC points 6-7).

The agent's advantage is GRPO's z-score within each environment; the designer's is its reward
centred within its skill (no std division); the designer's upweighting travels as a per-sample
loss weight (``Sample.weight``, from ``spadekit.train.sample``), not folded into the advantage.
Designer samples are trained ``regen_interval`` rounds late and need their behaviour logprobs
for truncated importance sampling (``drop_without_logprobs``). Plain floats, torch-free.
"""

from __future__ import annotations

import math
from typing import Any, Iterable, Literal, Sequence

__all__ = ["agent_advantages", "designer_advantages", "designer_weight", "Sample",
           "drop_without_logprobs", "per_turn_samples", "turn_spans", "ROLES"]

from spadekit.selfplay.rewards import RewardConfig
from spadekit.train.sample import ROLES, Sample


def _floats(values: Sequence[float], what: str) -> list[float]:
    out = [float(v) for v in values]
    if not all(math.isfinite(v) for v in out):
        raise ValueError(f"{what}: values must be finite, got {out}")
    return out


def _mean(values: list[float]) -> float:
    return math.fsum(values) / len(values)


def agent_advantages(returns_by_env: dict[str, list[float]],
                     eps: float = 1e-8) -> dict[str, list[float]]:
    """GRPO advantages of the agent's plays, one group per environment.

    For each environment, ``A_i = (r_i - mean) / (std + eps)`` where ``std`` is the population
    standard deviation of that environment's returns (``sqrt(sum((r - mean)^2) / n)``). A group
    whose returns are all equal (including a group of one) gets exact zeros: it carries no
    preference. An empty group maps to an empty list. Order within each list is preserved.
    """
    if eps < 0:
        raise ValueError(f"agent_advantages: eps must be >= 0, got {eps}")
    out: dict[str, list[float]] = {}
    for env_id, returns in returns_by_env.items():
        values = _floats(returns, f"agent_advantages[{env_id!r}]")
        if not values or max(values) == min(values):
            out[env_id] = [0.0] * len(values)
            continue
        mean = _mean(values)
        std = math.sqrt(math.fsum((v - mean) ** 2 for v in values) / len(values))
        out[env_id] = [(v - mean) / (std + eps) for v in values]
    return out


def designer_advantages(rewards_by_skill: dict[str, list[float]]) -> dict[str, list[float]]:
    """Designer advantages: each reward minus the mean reward of its skill (no std division).

    A skill with a single sample has no peer to be compared with, and centring it within its
    skill would always give 0 (no gradient for that program). Such a sample is instead centred
    against the round's mean over ALL designer rewards passed in (every skill together): the
    fallback when a round designs fewer programs per skill than two, as the default preset does
    (2 programs over 3 skills). Skills with two or more samples are centred within the skill
    only, as SPEC point 6 says. With one designer sample in the whole round there is nothing to
    compare with, and it gets 0.0. An empty skill maps to an empty list.

    Example: ``{"A": [0.2, 0.6], "B": [0.9], "C": [0.1]}``: A's mean 0.4 -> -0.2, 0.2; the
    round's mean (0.2 + 0.6 + 0.9 + 0.1) / 4 = 0.45 -> B 0.45, C -0.35.
    """
    values_by_skill = {skill: _floats(rewards, f"designer_advantages[{skill!r}]")
                       for skill, rewards in rewards_by_skill.items()}
    everything = [v for values in values_by_skill.values() for v in values]
    round_mean = _mean(everything) if len(everything) > 1 else None
    out: dict[str, list[float]] = {}
    for skill, values in values_by_skill.items():
        if len(values) == 1:  # the fallback: against the round's mean over all skills
            out[skill] = [0.0 if round_mean is None else values[0] - round_mean]
        elif not values or max(values) == min(values):
            out[skill] = [0.0] * len(values)
        else:
            mean = _mean(values)
            out[skill] = [v - mean for v in values]
    return out


def designer_weight(n_agent_samples: int, n_designer_samples: int, regen_interval: int,
                    cap: float = RewardConfig.designer_weight_cap) -> float:
    """The designer's per-sample loss weight: ``min(n_agent / n_designer * regen_interval, cap)``.

    Designer samples are few (one per environment) and arrive once per ``regen_interval``
    rollouts, while agent samples arrive every rollout; the weight restores their share of the
    gradient. Paper setup: 192 agent samples, 24 designer samples, interval 4 -> 32.
    ``n_designer_samples`` must be > 0 (``ValueError`` otherwise: there is nothing to weight).
    """
    if n_designer_samples <= 0:
        raise ValueError(f"designer_weight: n_designer_samples must be > 0, "
                         f"got {n_designer_samples}")
    if n_agent_samples < 0:
        raise ValueError(f"designer_weight: n_agent_samples must be >= 0, got {n_agent_samples}")
    if regen_interval < 1:
        raise ValueError(f"designer_weight: regen_interval must be >= 1, got {regen_interval}")
    if not cap > 0:
        raise ValueError(f"designer_weight: cap must be > 0, got {cap}")
    return min(n_agent_samples / n_designer_samples * regen_interval, float(cap))


def drop_without_logprobs(samples: Iterable[Sample],
                          roles: Sequence[str] = ("designer",)) -> tuple[list[Sample], int]:
    """Drop the samples of ``roles`` (default: designer only) that have no behaviour logprobs;
    SPEC point 7 corrects designer samples with truncated importance sampling, which needs
    them. Agent samples are trained on-policy and are kept either way by default.
    Returns ``(kept, dropped_count)``, keeping the input order."""
    kept: list[Sample] = []
    dropped = 0
    for sample in samples:
        if sample.role in roles and sample.behaviour_logprobs is None:
            dropped += 1
        else:
            kept.append(sample)
    return kept, dropped


def turn_spans(loss_mask: Sequence[int],
               turns: Sequence[Any] | None = None) -> list[tuple[int, int]]:
    """The ``[start, end)`` spans of the assistant turns of a trajectory: the contiguous runs of
    1 in its ``loss_mask`` (between two turns there is always at least one observation or
    closing token with mask 0).

    With ``turns`` (``Trajectory.turns``: records with ``new_tokens``), the spans are checked
    against them: the turns that sampled tokens match the runs one for one, in length; one more
    run is allowed after them (a turn whose environment step failed records no ``TurnRecord``).
    A mismatch raises ``ValueError``: the mask does not separate the turns.
    """
    spans: list[tuple[int, int]] = []
    start = None
    for i, m in enumerate(loss_mask):
        if m and start is None:
            start = i
        elif not m and start is not None:
            spans.append((start, i))
            start = None
    if start is not None:
        spans.append((start, len(loss_mask)))
    if turns is not None:
        lengths = [int(t.new_tokens if hasattr(t, "new_tokens") else t["new_tokens"])
                   for t in turns]
        lengths = [n for n in lengths if n > 0]
        runs = [b - a for a, b in spans]
        if runs[:len(lengths)] != lengths or len(runs) - len(lengths) not in (0, 1):
            raise ValueError(f"turn_spans: loss_mask runs {runs} do not match the turns' sampled "
                             f"token counts {lengths}")
    return spans


def per_turn_samples(trajectory: Any, advantage: float, *, role: Literal["agent", "designer"]
                     = "agent", group_id: str = "", weight: float = 1.0,
                     generated_at_step: int = 0, truncated: bool = False) -> list[Sample]:
    """One ``Sample`` per assistant turn of a trajectory, each with the episode's advantage (as
    the SPADE reference trains thinking models, whose whole episodes grow too long; the
    alternative to one whole-episode sample, ``train.sample_granularity``).

    ``trajectory``: a ``spadekit.rollout.engine.Trajectory`` or any object (or dict) with
    ``token_ids``, ``loss_mask``, ``logprobs`` (or None) and optionally ``turns``. Turn ``k``'s
    sample is the prefix of the sequence up to the end of that turn's sampled tokens, with
    ``loss_mask`` 1 only on them and the behaviour logprobs cut to the same prefix; so the masks
    of the samples partition the trajectory's mask. A trajectory without sampled tokens gives
    no sample.
    """
    def get(name: str, default: Any = None) -> Any:
        if isinstance(trajectory, dict):
            return trajectory.get(name, default)
        return getattr(trajectory, name, default)

    token_ids = list(get("token_ids"))
    loss_mask = list(get("loss_mask"))
    logprobs = get("logprobs")
    if len(loss_mask) != len(token_ids) or (logprobs is not None
                                            and len(logprobs) != len(token_ids)):
        raise ValueError("per_turn_samples: token_ids, loss_mask and logprobs differ in length")
    out = []
    for start, end in turn_spans(loss_mask, get("turns")):
        mask = [0] * end
        mask[start:end] = [1] * (end - start)
        out.append(Sample(role=role, group_id=group_id, token_ids=token_ids[:end],
                          loss_mask=mask,
                          behaviour_logprobs=list(logprobs[:end]) if logprobs is not None
                          else None,
                          advantage=advantage, weight=weight,
                          generated_at_step=generated_at_step, truncated=truncated))
    return out
