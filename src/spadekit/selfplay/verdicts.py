"""The verdicts of the watch (``spadekit.selfplay.watch``): pure functions from one program's
scripted episodes and step times this round to a retirement reason, or None.

- ``spot_check_verdicts``: a timeout, a solution that fails, garbage or the policy's replies to
  other programs doing about as well as the solution (``garbage_wins``), a replay that differs
  from validation's reference episode;
- ``constant_answer_verdict``: every seed won by another seed's solution (``foreign_plan``);
- ``slow_verdict`` and ``turn_verdict``: steps, or a worker's turns, slower than the limits.

Each takes plain values (``ProbeResult``, seconds, the watch's config) and returns
``(reason, details)``: no sandbox, no database, so each is unit-tested against hand-made
episodes. ``ProbeResult`` is one scripted episode as the sandbox or the rollout batch played it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from statistics import fmean
from typing import Any

from spadekit.common.errors import SandboxError

__all__ = ["FOREIGN_MIN", "REPLY_MARGIN", "WIN", "ProbeResult", "constant_answer_verdict",
           "foreign_plan", "probe_result", "slow_verdict", "spot_check_verdicts",
           "turn_verdict", "worker_turns"]

WIN = 1.0
"""Full score (the validator's and the solution check's threshold)."""
FOREIGN_MIN = 12
"""Foreign-solution episodes needed for a ``constant_answer`` verdict: an honest game with m
equally likely hidden states is retired with chance about (1/m) ** (n - 1) a round for n >=
FOREIGN_MIN of them (m = 2: 0.05% at 12), and the watch judges every round, so this stays
high."""
REPLY_MARGIN = 0.25
"""The solution's mean return must beat the replayed replies' by this much (or by
``watch.action_margin`` if smaller). Replies to other programs are real moves: in an honest game
with a small answer space (four doors) they are right a quarter of the time, like the
validator's random policy, so they get its margin, not garbage's: with the garbage margin one
lucky reply retired honest door games."""


@dataclass
class ProbeResult:
    """One scripted episode: what each step returned and how long it took."""

    seed: int
    actions: list[str]
    rewards: list[float] = field(default_factory=list)
    ends: list[bool] = field(default_factory=list)
    """Per step: terminated or truncated."""
    step_s: list[float] = field(default_factory=list)
    error: SandboxError | dict[str, Any] | None = None
    """The typed failure that ended it (a ``SandboxError``, or its ``to_dict()``)."""
    terminated: bool = False
    """Whether the program terminated the episode at its last step."""

    @property
    def ended(self) -> bool:
        """Whether the program ended the episode (terminated or truncated) at its last step."""
        return bool(self.ends and self.ends[-1])

    @property
    def episode_return(self) -> float:
        """SPEC point 4: the last reward if terminated, else 0 (and 0 after a failure)."""
        if self.error is not None or not self.rewards or not self.terminated:
            return 0.0
        return float(self.rewards[-1])

    @property
    def error_reason(self) -> str | None:
        if self.error is None:
            return None
        return self.error.get("reason") if isinstance(self.error, dict) else self.error.reason

    def error_dict(self) -> dict[str, Any] | None:
        if self.error is None:
            return None
        return dict(self.error) if isinstance(self.error, dict) else self.error.to_dict()


def probe_result(tr: Any) -> ProbeResult:
    """The ``ProbeResult`` of a scripted ``Trajectory`` (a spot check played in the batch)."""
    return ProbeResult(seed=tr.spec.seed, actions=[t.action for t in tr.turns],
                       rewards=[float(t.reward) for t in tr.turns],
                       ends=[bool(t.terminated or t.truncated) for t in tr.turns],
                       step_s=[t.step_s for t in tr.turns], error=tr.failure,
                       terminated=bool(tr.turns and tr.turns[-1].terminated))


def spot_check_verdicts(garbage: list[ProbeResult], replay: ProbeResult | None,
                        admitted: dict[str, Any] | None, solution: list[ProbeResult] = (),
                        margin: float = 0.5, replies: list[ProbeResult] = ()
                        ) -> tuple[str | None, dict[str, Any]]:
    """The retirement reason (or None) from one program's spot checks this round, in this
    order: a timeout; a solution episode that failed; garbage whose mean return is not at least
    ``margin`` below the mean return of the solution episodes on the same seeds (``WIN`` when
    none), and the same of ``replies`` (the policy's own replies to other programs, judged as
    garbage on their own: ``baseline`` in the details says which); a solution episode that did
    not reach full score; a replay that differs from validation's reference episode
    (``admitted``: its seed, actions, rewards, terminated, truncated). Other typed failures of a
    garbage episode (an environment raising on garbage) count as return 0, not as a reason."""
    solution, replies = list(solution), list(replies)
    for res in garbage + replies + solution + ([replay] if replay is not None else []):
        if res.error_reason == "timeout":
            return "play_timeout", {"seed": res.seed, "error": res.error_dict()}
    for res in solution:  # its own solution crashed in play: no reference to judge by
        if res.error is not None:
            return "solution_fails_in_play", {"seed": res.seed, "actions": res.actions,
                                              "rewards": res.rewards,
                                              "error": res.error_dict()}
    for baseline, group, need in (("garbage", garbage, margin),
                                  ("policy_replies", replies, min(margin, REPLY_MARGIN))):
        if not group:
            continue
        seeds = {r.seed for r in group}
        paired = [r for r in solution if r.seed in seeds]
        garbage_mean = fmean([r.episode_return for r in group])
        reference = fmean([r.episode_return for r in paired]) if paired else WIN
        if reference - garbage_mean < need:
            worst = max(group, key=lambda r: r.episode_return)
            return "garbage_wins", {"garbage_mean_return": garbage_mean,
                                    "solution_mean_return": reference, "baseline": baseline,
                                    "solution_known": bool(paired), "margin": need,
                                    "seed": worst.seed, "actions": worst.actions,
                                    "rewards": worst.rewards}
    for res in solution:
        if res.episode_return < WIN:
            return "solution_fails_in_play", {"seed": res.seed, "actions": res.actions,
                                              "rewards": res.rewards}
    if replay is not None and admitted is not None and replay.error is None:
        ended = bool(admitted.get("terminated") or admitted.get("truncated"))
        if replay.rewards != list(admitted["rewards"]) or replay.ended != ended:
            return "nondeterministic_in_play", {"seed": replay.seed,
                                                "validated_rewards": admitted["rewards"],
                                                "replayed_rewards": replay.rewards}
    return None, {}


def foreign_plan(seeds: list[int], solutions: dict[int, list[str]]
                 ) -> list[tuple[str, int, list[str]]]:
    """``("foreign", seed, actions)`` for each seed with a known solution: the solution of the
    next such seed, cyclically; none with fewer than ``FOREIGN_MIN`` known seeds."""
    known = [s for s in dict.fromkeys(seeds) if s in solutions]
    if len(known) < FOREIGN_MIN:
        return []
    return [("foreign", s, solutions[known[(i + 1) % len(known)]]) for i, s in enumerate(known)]


def constant_answer_verdict(foreign: list[ProbeResult]) -> tuple[str | None, dict[str, Any]]:
    """``constant_answer`` when at least ``FOREIGN_MIN`` foreign-solution episodes (each seed
    played with another seed's solution) all ran without error and all reached full score;
    else None. One that fails or falls short clears the program."""
    if len(foreign) < FOREIGN_MIN or any(r.error is not None or r.episode_return < WIN
                                         for r in foreign):
        return None, {}
    return "constant_answer", {"episodes": len(foreign), "seeds": [r.seed for r in foreign],
                               "actions": foreign[0].actions,
                               "returns": [r.episode_return for r in foreign]}


def slow_verdict(step_s: list[float], base: float | None,
                 config: Any) -> tuple[str | None, dict[str, Any]]:
    """``slow_in_play`` when the mean of one program's step times this round is over the
    absolute limit, or over ``slow_step_factor`` times ``base`` (its median call time in
    validation, seconds; None: unknown) and over ``slow_step_min_s``; else None."""
    if not step_s:
        return None, {}
    mean = sum(step_s) / len(step_s)
    details = {"mean_step_s": mean, "validation_step_s": base, "steps": len(step_s)}
    if mean > config.step_time_limit_s:
        return "slow_in_play", {**details, "limit_s": config.step_time_limit_s}
    if base is not None and mean > config.slow_step_min_s and \
            mean > config.slow_step_factor * base:
        return "slow_in_play", {**details, "factor": config.slow_step_factor}
    return None, {}


def turn_verdict(worker_turn_s: list[float],
                 config: Any) -> tuple[str | None, dict[str, Any]]:
    """``slow_in_play`` when the mean over the round's turns of one program's worker time per
    turn (one figure per turn: all its episodes there together) exceeds
    ``turn_time_limit_s``; else None."""
    if not worker_turn_s:
        return None, {}
    mean = sum(worker_turn_s) / len(worker_turn_s)
    if mean > config.turn_time_limit_s:
        return "slow_in_play", {"mean_worker_turn_s": mean,
                                "max_worker_turn_s": max(worker_turn_s),
                                "turns": len(worker_turn_s),
                                "turn_limit_s": config.turn_time_limit_s}
    return None, {}


def worker_turns(group: list[Any]) -> list[float]:
    """One program's worker time per rollout turn: turn ``k`` of every episode of it stepped
    in the same call, so the figure of turn ``k`` is the largest ``worker_turn_s`` reported
    for it (the slowest worker serving the program, where several do)."""
    per_turn: dict[int, float] = {}
    for tr in group:
        for k, turn in enumerate(tr.turns):
            w = getattr(turn, "worker_turn_s", None)
            if w is not None:
                per_turn[k] = max(per_turn.get(k, 0.0), float(w))
    return [per_turn[k] for k in sorted(per_turn)]
