"""Rewards of both SPADE roles (SPEC points 3-5) and the run's ``reward.*`` knobs.

The agent's reward of one play is its episode return (``episode_return``). The designer's
reward of one environment is a signal of its plays (``DESIGNER_SIGNALS``): SPADE's ``blend``
of hint regret and the win-rate plateau, or an ablation. ``RewardConfig`` declares every
constant once (SPEC values as defaults); the functions below default to them. Every statistic
over returns raises ``ValueError`` on an empty or non-finite list: an environment with no plays
has no measurement. Failed programs get fixed rewards (``designer_reward_for_failure``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Annotated, Any, Callable, Literal, NamedTuple, Sequence

from pydantic import Field, StrictFloat

from spadekit.sandbox.play import episode_return
from spadekit.train.config import Bool, Number, Positive, Str, Unit, section

__all__ = [
    "episode_return",
    "regret", "regret_norm", "plateau", "win_rate", "above_chance", "return_variance",
    "WIN_RATE_INPUTS",
    "solve_rate", "designer_reward",
    "HANG_PENALTY", "INVALID_REWARD", "HANG_REASONS", "FailureReward",
    "designer_reward_for_failure",
    "EmaTracker", "azr_learnability",
    "EnvStats", "RewardConfig", "DesignerSignal", "DESIGNER_SIGNALS",
    "register_designer_signal", "designer_signal",
]

Alpha = Annotated[StrictFloat, Field(gt=0, le=1)]
WIN_RATE_INPUTS = ("mean_return", "positive_share")
"""What "win rate" means for the plateau (``reward.win_rate_input``): ``mean_return`` (the
reference's, the default) or ``positive_share`` (share of returns > 0)."""


@section
class RewardConfig:
    """The designer's reward and the agent's failure return (``reward.*``); every field may
    be changed by round with ``schedule`` (e.g. the 4B run's later band [0.2, 0.4])."""

    signal: Str = "blend"
    """A name in ``DESIGNER_SIGNALS``: blend (regret_weight * regret_norm + plateau_weight *
    plateau), regret, plateau, learning_potential, solve_rate, azr."""
    regret_scale: Positive = 0.15
    """regret_norm = clip(regret / regret_scale, 0, 1)."""
    regret_weight: Number = 0.4
    plateau_weight: Number = 0.6
    plateau_low: Unit = 0.4
    """The plateau band [plateau_low, plateau_high] of the lifetime win rate scores 1."""
    plateau_high: Unit = 0.6
    plateau_ramp: Positive = 0.25
    """Outside the band the plateau falls linearly to 0 over this distance."""
    win_rate_input: Literal[WIN_RATE_INPUTS] = "mean_return"
    """The plateau's "win rate" (and the memory's seed bands, the EMA's per-round win rate):
    ``mean_return`` of the no-hint plays in the window clipped to [0, 1] (SPEC point 5), or
    ``positive_share``, the share of them with return > 0 (an ablation)."""
    above_chance: Bool = False
    """The plateau reads ``(w - c) / (1 - c)``, ``c`` the best mean return of a blind reply
    that validation measured (0 where unmeasured), so a game paying a copied answer or a
    lucky guess stays off the plateau. Off: the reference's win rate."""
    failed_episode_reward: Number = 0.0
    """Return given to a crashed agent episode (the reference uses -1)."""
    designer_weight_cap: Positive = 50.0
    """Cap of the designer's loss weight min(n_agent / n_designer * regen_interval, cap)."""
    ema_alpha_fast: Alpha = 0.3
    """learning_potential: the fast EMA's weight of each round's win rate (reference 0.99)."""
    ema_alpha_slow: Alpha = 0.05
    """learning_potential: the slow EMA's weight (reference 0.95)."""
    ema_scale: Positive = 1.0
    """learning_potential = ema_scale * |fast - slow| (reference 1 / (2 * (0.99 - 0.95)))."""

    def __post_init__(self) -> None:
        if self.signal not in DESIGNER_SIGNALS:
            raise ValueError(f"reward.signal must be one of "
                             f"{', '.join(sorted(DESIGNER_SIGNALS))}, got {self.signal!r}")
        if self.plateau_low > self.plateau_high:
            raise ValueError(f"reward.plateau_low must be <= reward.plateau_high, got "
                             f"{self.plateau_low} > {self.plateau_high}")
        if self.above_chance and self.win_rate_input != "mean_return":
            raise ValueError("reward.above_chance measures the win rate above a chance mean "
                             "return, so reward.win_rate_input must be mean_return, got "
                             f"{self.win_rate_input!r}")

    def win_rate(self, returns: Sequence[float]) -> float:
        return win_rate(returns, self.win_rate_input)

    def plateau_input(self, stats: "EnvStats") -> float:
        """The win rate the plateau reads: the lifetime one, above chance when ``above_chance``."""
        w = self.win_rate(stats.lifetime())
        return above_chance(w, stats.chance) if self.above_chance else w

    def plateau(self, win_rate: float) -> float:
        return plateau(win_rate, self.plateau_low, self.plateau_high, self.plateau_ramp)

    def regret_norm(self, regret: float) -> float:
        return regret_norm(regret, self.regret_scale)

    def ema(self) -> "EmaTracker":
        """A fresh learning-potential tracker with these EMA constants."""
        return EmaTracker(self.ema_alpha_fast, self.ema_alpha_slow, self.ema_scale)


SOLVED = 1.0
"""An environment's reward for a solved episode (rewards lie in [0, 1], 1.0 = solved)."""


def _returns(returns: Sequence[float], what: str) -> list[float]:
    """The returns as floats; ValueError when empty or not finite."""
    values = [float(r) for r in returns]
    if not values:
        raise ValueError(f"{what}: no returns (an environment with no plays has no measurement)")
    if not all(math.isfinite(v) for v in values):
        raise ValueError(f"{what}: returns must be finite, got {values}")
    return values


def _finite(value: float, what: str) -> float:
    value = float(value)
    if not math.isfinite(value):
        raise ValueError(f"{what} must be finite, got {value}")
    return value


# ----- hint regret --------------------------------------------------------------------------------
def regret(returns_with_hint: Sequence[float], returns_without_hint: Sequence[float]) -> float:
    """Hint regret: mean return with the hint minus mean return without it.

    Both lists must come from the same policy snapshot at the same step (SPEC: both at offset 0,
    the generation step); matching the timing is the caller's job. The two lists may differ in
    length. Raises ``ValueError`` if either is empty.
    """
    with_hint = _returns(returns_with_hint, "regret (with hint)")
    without = _returns(returns_without_hint, "regret (without hint)")
    return math.fsum(with_hint) / len(with_hint) - math.fsum(without) / len(without)


def regret_norm(regret: float, scale: float = RewardConfig.regret_scale) -> float:
    """``clip(regret / scale, 0, 1)``: a hint that hurts counts as zero regret; a gain of
    ``scale`` or more saturates at 1. No batch-std division."""
    if not scale > 0:
        raise ValueError(f"regret_norm: scale must be > 0, got {scale}")
    return min(1.0, max(0.0, _finite(regret, "regret") / scale))


# ----- win rate and plateau -----------------------------------------------------------------------
def win_rate(returns: Sequence[float], input: str = "mean_return") -> float:
    """The win rate of a list of returns. ``input="mean_return"`` (default, the reference's
    ``win_rate = mean(window rewards)``): their mean, clipped to [0, 1] (a program paying outside
    [0, 1] cannot push the plateau's input out of its domain); ``"positive_share"``: the share of
    returns strictly greater than 0. Raises ``ValueError`` on an empty list or an unknown input.

    For the designer reward, pass the environment's no-hint returns over its whole life in the
    pool (not only the generation step). Hand check: returns ``[0.2, 0, 0.2, 0]`` have mean
    return 0.1 and positive share 0.5."""
    values = _returns(returns, "win_rate")
    if input == "mean_return":
        return min(1.0, max(0.0, math.fsum(values) / len(values)))
    if input == "positive_share":
        return sum(1 for v in values if v > 0) / len(values)
    raise ValueError(f"win_rate: input must be one of {', '.join(WIN_RATE_INPUTS)}, got "
                     f"{input!r}")


def above_chance(win_rate: float, chance: float) -> float:
    """The win rate above chance: ``(win_rate - chance) / (1 - chance)`` clipped to [0, 1], 0
    when ``chance >= 1``. ``chance`` is the best mean return of a blind reply (the validator's
    ``chance_return``: the program's printed actions replied every turn, other seeds'
    solutions, the random policy, garbage). Hand check: a guess among three answers wins 1/3;
    an agent at win rate 0.5 is 0.25 above it, one at 1/3 is at 0. Raises ``ValueError``
    outside [0, 1]."""
    w, c = _finite(win_rate, "win_rate"), _finite(chance, "chance")
    if not (0.0 <= w <= 1.0 and 0.0 <= c <= 1.0):
        raise ValueError(f"above_chance: win_rate and chance must lie in [0, 1], got {w}, {c}")
    return 0.0 if c >= 1.0 else min(1.0, max(0.0, (w - c) / (1.0 - c)))


def return_variance(returns: Sequence[float]) -> float:
    """Population variance of the returns (the reference's "bimodal-hack monitor": a mean of
    0.5 from returns that are all 0 or 1 has variance 0.25, from returns all 0.5 has 0).
    Raises ``ValueError`` on an empty list."""
    values = _returns(returns, "return_variance")
    mean = math.fsum(values) / len(values)
    return math.fsum((v - mean) ** 2 for v in values) / len(values)


def plateau(win_rate: float, low: float = RewardConfig.plateau_low,
            high: float = RewardConfig.plateau_high,
            ramp: float = RewardConfig.plateau_ramp) -> float:
    """1 for a win rate inside ``[low, high]``; outside, ``max(0, 1 - distance / ramp)`` where
    distance is how far the win rate lies from the nearer edge of the band. With the defaults:
    0 at 0.15 and below, 0.6 at 0.3 and 0.7, 1 on [0.4, 0.6], 0 at 0.85 and above."""
    if not 0.0 <= low <= high <= 1.0:
        raise ValueError(f"plateau: need 0 <= low <= high <= 1, got low={low}, high={high}")
    if not ramp > 0:
        raise ValueError(f"plateau: ramp must be > 0, got {ramp}")
    w = _finite(win_rate, "win_rate")
    if not 0.0 <= w <= 1.0:
        raise ValueError(f"plateau: win_rate must lie in [0, 1], got {w}")
    distance = low - w if w < low else (w - high if w > high else 0.0)
    return max(0.0, 1.0 - distance / ramp)


def designer_reward(regret_norm: float, plateau: float,
                    regret_weight: float = RewardConfig.regret_weight,
                    plateau_weight: float = RewardConfig.plateau_weight) -> float:
    """SPADE's designer reward: ``regret_weight * regret_norm + plateau_weight * plateau``."""
    return (regret_weight * _finite(regret_norm, "regret_norm")
            + plateau_weight * _finite(plateau, "plateau"))


# ----- programs that never got played -------------------------------------------------------------
HANG_PENALTY = -0.5
"""Designer reward for a program that hangs during validation (it is also blacklisted)."""
INVALID_REWARD = 0.0
"""Designer reward for any other invalid program (it is never played)."""
HANG_REASONS = frozenset({"timeout", "slow"})
"""Failure ``reason`` codes (``spadekit.common.errors`` / ``ValidationReport.reason``) that count as a
hang: ``timeout`` (a deadline passed) and ``slow`` (the validator saw repeated resets or steps
over its slow limit: the same program retired from play, ``spadekit.selfplay.watch``'s ``slow_in_play``,
also costs -0.5). A kill by a resource limit arrives as ``resource_limit`` and counts as
plainly invalid, and so do ``oversized`` and ``parent_budget`` (the parent could not read what
the program returned within its caps and budget, ``spadekit.envs.scan_limits``): that time is
the parent's, not a hang of the program."""


class FailureReward(NamedTuple):
    reward: float
    blacklist: bool


def designer_reward_for_failure(reason: str) -> FailureReward:
    """The designer's reward for a program that failed validation, from the failure's reason code:
    a hang (``timeout`` or ``slow``) -> ``(-0.5, blacklist=True)``; anything else ->
    ``(0.0, False)``."""
    if not isinstance(reason, str):
        raise TypeError(f"designer_reward_for_failure: reason must be a str, got {reason!r}")
    if reason in HANG_REASONS:
        return FailureReward(HANG_PENALTY, True)
    return FailureReward(INVALID_REWARD, False)


# ----- ablation signals ---------------------------------------------------------------------------
def solve_rate(returns: Sequence[float], threshold: float = SOLVED) -> float:
    """Share of returns that reach ``threshold`` (default 1.0, "solved"). Unlike ``win_rate``,
    partial credit does not count at all. Raises ``ValueError`` on an empty list."""
    values = _returns(returns, "solve_rate")
    return sum(1 for v in values if v >= threshold) / len(values)


def azr_learnability(acc: float) -> float:
    """Absolute-Zero-style learnability: ``1 - acc if acc > 0 else 0`` (an environment nobody
    solves teaches nothing; otherwise the harder, the better). ``acc`` lies in [0, 1]."""
    acc = _finite(acc, "acc")
    if not 0.0 <= acc <= 1.0:
        raise ValueError(f"azr_learnability: acc must lie in [0, 1], got {acc}")
    return 1.0 - acc if acc > 0 else 0.0


class EmaTracker:
    """Fast and slow exponential moving averages of one environment's win rate; their gap is the
    "learning potential" ablation signal (how fast the agent's success there is changing).

    Definition: feed ``update(w)`` once per rollout with the environment's win rate IN THAT
    ROLLOUT (not its cumulative win rate, which changes ever more slowly and halves the signal).
    The first update sets both averages to ``w``; each later one does
    ``fast += alpha_fast * (w - fast)`` and ``slow += alpha_slow * (w - slow)``.
    ``learning_potential = scale * |fast - slow|``, and 0.0 before any update.

    Defaults ``alpha_fast = 0.3``, ``alpha_slow = 0.05``, ``scale = 1`` (``reward.ema_*``): per
    round 0, .25, .5, .75 give 0.294. The reference uses ``0.99``, ``0.95`` and
    ``scale = 1 / (2 * (0.99 - 0.95)) = 12.5`` (the same update, with its gammas as the weight of
    the new value): both averages then follow the last win rate almost at once and the signal is
    about half the last round-to-round change (0.133 on the same series), so a single noisy round
    decides it; set ``reward.ema_alpha_fast=0.99 reward.ema_alpha_slow=0.95
    reward.ema_scale=12.5`` to reproduce it.
    """

    def __init__(self, alpha_fast: float = RewardConfig.ema_alpha_fast,
                 alpha_slow: float = RewardConfig.ema_alpha_slow, scale: float = RewardConfig.ema_scale) -> None:
        for name, alpha in (("alpha_fast", alpha_fast), ("alpha_slow", alpha_slow)):
            if not 0.0 < alpha <= 1.0:
                raise ValueError(f"EmaTracker: {name} must lie in (0, 1], got {alpha}")
        if not (math.isfinite(scale) and scale > 0):
            raise ValueError(f"EmaTracker: scale must be > 0, got {scale}")
        self.alpha_fast = float(alpha_fast)
        self.alpha_slow = float(alpha_slow)
        self.scale = float(scale)
        self.fast: float | None = None
        self.slow: float | None = None
        self.count = 0

    def update(self, win_rate: float) -> float:
        """Fold in one observed win rate; returns the new learning potential."""
        w = _finite(win_rate, "win_rate")
        if not 0.0 <= w <= 1.0:
            raise ValueError(f"EmaTracker.update: win_rate must lie in [0, 1], got {w}")
        if self.fast is None or self.slow is None:
            self.fast = self.slow = w
        else:
            self.fast += self.alpha_fast * (w - self.fast)
            self.slow += self.alpha_slow * (w - self.slow)
        self.count += 1
        return self.learning_potential

    @property
    def learning_potential(self) -> float:
        if self.fast is None or self.slow is None:
            return 0.0
        return self.scale * abs(self.fast - self.slow)

    def state_dict(self) -> dict[str, Any]:
        """JSON-safe state, enough to resume the tracker exactly."""
        return {"alpha_fast": self.alpha_fast, "alpha_slow": self.alpha_slow,
                "scale": self.scale, "fast": self.fast, "slow": self.slow, "count": self.count}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore from ``state_dict()`` output; the stored alphas (and scale, 1.0 in a state
        written before it existed) replace the current ones."""
        missing = {"alpha_fast", "alpha_slow", "fast", "slow", "count"} - set(state)
        if missing:
            raise KeyError(f"EmaTracker.load_state_dict: missing {sorted(missing)}")
        if (state["fast"] is None) != (state["slow"] is None):
            raise ValueError("EmaTracker.load_state_dict: fast and slow must both be set or None")
        restored = EmaTracker(state["alpha_fast"], state["alpha_slow"], state.get("scale", 1.0))
        self.alpha_fast, self.alpha_slow = restored.alpha_fast, restored.alpha_slow
        self.scale = restored.scale
        self.fast = None if state["fast"] is None else float(state["fast"])
        self.slow = None if state["slow"] is None else float(state["slow"])
        self.count = int(state["count"])

    def __repr__(self) -> str:
        return (f"EmaTracker(alpha_fast={self.alpha_fast}, alpha_slow={self.alpha_slow}, "
                f"scale={self.scale}, "
                f"fast={self.fast}, slow={self.slow}, count={self.count})")


# ----- the registry of designer signals -----------------------------------------------------------
@dataclass
class EnvStats:
    """What the designer signals need to know about one environment.

    ``returns_with_hint`` / ``returns_without_hint``: the plays at the generation step (offset 0,
    same snapshot). ``lifetime_returns``: every no-hint return of the environment over its life in
    the pool so far (None means: only the generation-step plays exist, use
    ``returns_without_hint``). ``ema``: the environment's win-rate tracker, needed only by
    ``learning_potential``. ``chance``: the mean return of a blind reply (the validator's
    ``chance_return``; 0 where unmeasured), read by the plateau with ``above_chance``.
    """

    returns_with_hint: Sequence[float]
    returns_without_hint: Sequence[float]
    lifetime_returns: Sequence[float] | None = None
    chance: float = 0.0
    ema: EmaTracker | None = None

    def lifetime(self) -> Sequence[float]:
        return (self.returns_without_hint if self.lifetime_returns is None
                else self.lifetime_returns)


DesignerSignal = Callable[[EnvStats, RewardConfig], float]
"""``(stats, params) -> reward`` of one environment."""


def _signal_blend(stats: EnvStats, p: RewardConfig) -> float:
    return designer_reward(p.regret_norm(regret(stats.returns_with_hint,
                                                stats.returns_without_hint)),
                           p.plateau(p.plateau_input(stats)), p.regret_weight,
                           p.plateau_weight)


def _signal_regret(stats: EnvStats, p: RewardConfig) -> float:
    return p.regret_norm(regret(stats.returns_with_hint, stats.returns_without_hint))


def _signal_plateau(stats: EnvStats, p: RewardConfig) -> float:
    return p.plateau(p.plateau_input(stats))


def _signal_learning_potential(stats: EnvStats, p: RewardConfig) -> float:
    if stats.ema is None:
        raise ValueError("the learning_potential signal needs EnvStats.ema")
    return stats.ema.learning_potential


def _signal_solve_rate(stats: EnvStats, p: RewardConfig) -> float:
    return solve_rate(stats.lifetime())


def _signal_azr(stats: EnvStats, p: RewardConfig) -> float:
    return azr_learnability(solve_rate(stats.lifetime()))


DESIGNER_SIGNALS: dict[str, DesignerSignal] = {
    "blend": _signal_blend,                            # SPADE: 0.4 regret_norm + 0.6 plateau
    "regret": _signal_regret,                          # regret_norm alone
    "plateau": _signal_plateau,                        # plateau(lifetime win rate) alone
    "learning_potential": _signal_learning_potential,  # scaled |fast EMA - slow EMA| of win rate
    "solve_rate": _signal_solve_rate,                  # plain lifetime solve rate (return >= 1)
    "azr": _signal_azr,                                # 1 - solve rate if > 0 else 0
}
"""Designer reward signals by name. ``blend`` is SPADE's; the rest are ablations."""


def register_designer_signal(name: str, fn: DesignerSignal, *, overwrite: bool = False) -> None:
    """Add a signal to ``DESIGNER_SIGNALS`` (explicitly: nothing registers on import)."""
    if not isinstance(name, str) or not name:
        raise TypeError(f"signal name must be a non-empty str, got {name!r}")
    if not callable(fn):
        raise TypeError(f"signal {name!r} must be callable, got {fn!r}")
    if name in DESIGNER_SIGNALS and not overwrite:
        raise ValueError(f"signal {name!r} is already registered (pass overwrite=True)")
    DESIGNER_SIGNALS[name] = fn


SPEC = RewardConfig()
"""SPEC's reward constants (a config that sets nothing)."""


def designer_signal(name: str, stats: EnvStats, params: RewardConfig = SPEC) -> float:
    """The designer reward of one environment under the named signal, with the run's reward
    constants (``config.reward``; SPEC's values by default)."""
    try:
        fn = DESIGNER_SIGNALS[name]
    except KeyError:
        raise KeyError(f"unknown designer signal {name!r}; known: "
                       f"{', '.join(sorted(DESIGNER_SIGNALS))}") from None
    return float(fn(stats, params))
