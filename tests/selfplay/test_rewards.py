"""spadekit.selfplay.rewards: every expected number below is worked out by hand in the comments."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, strategies as st

from spadekit.sandbox import play

from spadekit.selfplay import rewards
from spadekit.selfplay.rewards import (DESIGNER_SIGNALS, HANG_PENALTY, INVALID_REWARD, EmaTracker,
                              RewardConfig, EnvStats, FailureReward, azr_learnability, designer_reward,
                              designer_reward_for_failure, designer_signal, episode_return,
                              plateau, register_designer_signal, regret, regret_norm,
                              solve_rate, win_rate)

approx = pytest.approx


# ----- episode return (re-exported, not duplicated) -----------------------------------------------
def test_episode_return_is_play_s_function():
    assert episode_return is play.episode_return
    assert episode_return(0.7, True) == 0.7
    assert episode_return(0.7, False) == 0.0      # truncated / not finished -> 0
    assert episode_return(None, True) == 0.0      # no step taken


# ----- regret -------------------------------------------------------------------------------------
def test_regret_hand_value():
    # with hint: (1 + 0.5 + 0 + 0.5) / 4 = 0.5 ; without: (0 + 0.2 + 0.1) / 3 = 0.1
    # regret: 0.5 - 0.1 = 0.4
    assert regret([1.0, 0.5, 0.0, 0.5], [0.0, 0.2, 0.1]) == approx(0.4)


def test_regret_negative_when_hint_hurts():
    # 0.25 - 0.75 = -0.5
    assert regret([0.0, 0.5], [1.0, 0.5]) == approx(-0.5)


def test_regret_empty_raises():
    with pytest.raises(ValueError):
        regret([], [1.0])
    with pytest.raises(ValueError):
        regret([1.0], [])


def test_regret_non_finite_raises():
    with pytest.raises(ValueError):
        regret([float("nan")], [0.0])


@pytest.mark.parametrize(("r", "expected"), [
    (-0.3, 0.0),     # negative regret is floored at 0
    (0.0, 0.0),
    (0.03, 0.2),     # 0.03 / 0.15 = 0.2
    (0.075, 0.5),    # 0.075 / 0.15 = 0.5
    (0.15, 1.0),     # exactly the scale
    (0.6, 1.0),      # 4.0 clipped to 1
])
def test_regret_norm(r, expected):
    assert regret_norm(r) == approx(expected)


def test_regret_norm_custom_scale_and_bad_scale():
    assert regret_norm(0.1, scale=0.4) == approx(0.25)   # 0.1 / 0.4
    with pytest.raises(ValueError):
        regret_norm(0.1, scale=0.0)


# ----- win rate and plateau -----------------------------------------------------------------------
def test_positive_share_counts_strictly_positive():
    # > 0: 0.1, 1.0, 0.5 -> 3 of 5 ; 0.0 and -1 are losses
    assert win_rate([0.0, 0.1, 1.0, -1.0, 0.5], "positive_share") == approx(0.6)


def test_win_rate_is_the_mean_return_by_default():
    # the reference's: mean(0.0, 0.1, 1.0, 0.0, 0.5) = 1.6 / 5 = 0.32
    assert win_rate([0.0, 0.1, 1.0, 0.0, 0.5]) == approx(0.32)
    assert win_rate([0.0, 0.1, 1.0, 0.0, 0.5], "mean_return") == approx(0.32)
    # clipped to [0, 1]: mean(-1, 0) = -0.5 -> 0 ; mean(1.5, 1.0) = 1.25 -> 1
    assert win_rate([-1.0, 0.0]) == 0.0 and win_rate([1.5, 1.0]) == 1.0
    with pytest.raises(ValueError):
        win_rate([0.5], "share")


def test_a_lottery_sits_in_the_band_only_by_positive_share():
    # pays 0.2 on half the seeds whatever the agent does: share 4/8 = 0.5 -> plateau 1 ;
    # mean return 0.8 / 8 = 0.1 -> distance 0.3 to the band > ramp 0.25 -> plateau 0
    lottery = [0.2, 0.0] * 4
    assert plateau(win_rate(lottery, "positive_share")) == 1.0
    assert win_rate(lottery) == approx(0.1) and plateau(win_rate(lottery)) == 0.0
    stats = EnvStats(returns_with_hint=lottery, returns_without_hint=lottery)
    assert designer_signal("plateau", stats) == 0.0  # the default input
    assert designer_signal("plateau", stats, RewardConfig(win_rate_input="positive_share")) == 1.0
    # regret 0 -> blend = 0.6 * plateau
    assert designer_signal("blend", stats, RewardConfig(win_rate_input="positive_share")) \
        == approx(0.6)
    assert designer_signal("blend", stats) == 0.0
    with pytest.raises(ValueError):
        RewardConfig(win_rate_input="share")


def test_return_variance_is_the_bimodal_monitor():
    # all 0 or 1 around mean 0.5: each (x - 0.5)^2 = 0.25 -> 0.25 ; all 0.5 -> 0
    assert rewards.return_variance([0.0, 1.0, 0.0, 1.0]) == approx(0.25)
    assert rewards.return_variance([0.5] * 4) == 0.0
    # the lottery: mean 0.1, deviations +-0.1 -> 0.01
    assert rewards.return_variance([0.2, 0.0] * 4) == approx(0.01)
    with pytest.raises(ValueError):
        rewards.return_variance([])


def test_win_rate_empty_raises():
    with pytest.raises(ValueError):
        win_rate([])
    with pytest.raises(ValueError):
        win_rate([], "positive_share")


@pytest.mark.parametrize(("w", "expected"), [
    (0.0, 0.0),      # distance 0.4 > ramp 0.25 -> max(0, 1 - 1.6) = 0
    (0.15, 0.0),     # distance 0.25 -> 1 - 0.25/0.25 = 0
    (0.3, 0.6),      # distance 0.10 -> 1 - 0.4 = 0.6
    (0.4, 1.0),      # band edge
    (0.5, 1.0),
    (0.6, 1.0),      # band edge
    (0.7, 0.6),      # distance 0.10 -> 0.6
    (0.85, 0.0),     # distance 0.25 -> 0
    (0.9, 0.0),      # distance 0.30 -> max(0, -0.2) = 0
    (1.0, 0.0),
])
def test_plateau(w, expected):
    assert plateau(w) == approx(expected, abs=1e-12)


def test_plateau_custom_band_and_bad_input():
    # band [0.2, 0.3], ramp 0.5: w = 0.55 -> distance 0.25 -> 1 - 0.5 = 0.5
    assert plateau(0.55, low=0.2, high=0.3, ramp=0.5) == approx(0.5)
    with pytest.raises(ValueError):
        plateau(1.2)
    with pytest.raises(ValueError):
        plateau(0.5, low=0.7, high=0.6)
    with pytest.raises(ValueError):
        plateau(0.5, ramp=0.0)


# ----- the blend ----------------------------------------------------------------------------------
def test_designer_reward_blend():
    # 0.4 * 0.5 + 0.6 * 0.6 = 0.2 + 0.36 = 0.56
    assert designer_reward(0.5, 0.6) == approx(0.56)
    assert designer_reward(1.0, 1.0) == approx(1.0)
    assert designer_reward(0.0, 0.0) == 0.0
    # custom weights: 0.5 * 0.5 + 0.5 * 0.6 = 0.55
    assert designer_reward(0.5, 0.6, regret_weight=0.5, plateau_weight=0.5) == approx(0.55)


# ----- failures -----------------------------------------------------------------------------------
def test_failure_rewards():
    assert HANG_PENALTY == -0.5
    assert INVALID_REWARD == 0.0
    assert designer_reward_for_failure("timeout") == FailureReward(-0.5, True)
    # a program the validator found slow (repeated slow steps) is punished like a hang
    assert designer_reward_for_failure("slow") == FailureReward(-0.5, True)
    for reason in ("syntax", "load_error", "no_env_class", "bad_step_type", "resource_limit",
                   "worker_died", "empty_observation"):
        assert designer_reward_for_failure(reason) == FailureReward(0.0, False)
    with pytest.raises(TypeError):
        designer_reward_for_failure(None)  # type: ignore[arg-type]


# ----- ablation signals ---------------------------------------------------------------------------
def test_solve_rate_needs_full_reward():
    # >= 1.0: two of four (partial credit 0.9 and 0.5 do not count)
    assert solve_rate([1.0, 0.9, 0.5, 1.0]) == approx(0.5)
    assert solve_rate([0.5, 1.0], threshold=0.5) == approx(1.0)
    with pytest.raises(ValueError):
        solve_rate([])


@pytest.mark.parametrize(("acc", "expected"), [
    (0.0, 0.0),      # nobody solves it: nothing to learn
    (0.25, 0.75),    # 1 - 0.25
    (1.0, 0.0),      # 1 - 1
])
def test_azr_learnability(acc, expected):
    assert azr_learnability(acc) == approx(expected)


def test_ema_tracker_updates_by_hand():
    t = EmaTracker()                         # alpha_fast 0.3, alpha_slow 0.05
    assert t.learning_potential == 0.0       # before any update
    # first update: both set to 0.5 -> gap 0
    assert t.update(0.5) == 0.0
    # fast = 0.5 + 0.3 * (1 - 0.5) = 0.65 ; slow = 0.5 + 0.05 * 0.5 = 0.525 ; gap 0.125
    assert t.update(1.0) == approx(0.125)
    assert (t.fast, t.slow) == (approx(0.65), approx(0.525))
    # fast = 0.65 - 0.3 * 0.65 = 0.455 ; slow = 0.525 - 0.05 * 0.525 = 0.49875 ; gap 0.04375
    assert t.update(0.0) == approx(0.04375)
    assert t.count == 3


def test_ema_tracker_custom_alphas_and_validation():
    t = EmaTracker(alpha_fast=0.5, alpha_slow=0.25)
    t.update(0.0)
    # fast = 0.5 ; slow = 0.25 ; gap 0.25
    assert t.update(1.0) == approx(0.25)
    with pytest.raises(ValueError):
        EmaTracker(alpha_fast=0.0)
    with pytest.raises(ValueError):
        t.update(1.5)


def test_ema_tracker_state_round_trip():
    t = EmaTracker(alpha_fast=0.4, alpha_slow=0.1)
    for w in (0.2, 0.8, 0.5):
        t.update(w)
    state = json.loads(json.dumps(t.state_dict()))   # survives JSON (the run directory)
    resumed = EmaTracker()
    resumed.load_state_dict(state)
    assert resumed.state_dict() == t.state_dict()
    # both continue identically
    assert resumed.update(1.0) == t.update(1.0)
    # a fresh tracker round-trips too
    empty = EmaTracker()
    empty.load_state_dict(EmaTracker().state_dict())
    assert empty.fast is None and empty.learning_potential == 0.0
    with pytest.raises(KeyError):
        empty.load_state_dict({"fast": 0.1})


def _stats() -> EnvStats:
    tracker = EmaTracker()
    tracker.update(0.5)
    tracker.update(1.0)                                   # gap 0.125 (see above)
    return EnvStats(
        returns_with_hint=[1.0, 1.0, 0.5, 0.5],           # mean 0.75
        returns_without_hint=[1.0, 0.0, 0.5, 0.5],        # mean 0.5 ; regret 0.25 -> norm 1
        # lifetime: mean return 2.5 / 10 = 0.25 -> distance 0.15 -> plateau 1 - 0.6 = 0.4
        # (positive share 3 of 10 -> 0.3 -> plateau 0.6) ; solved (>= 1) 2 of 10 -> 0.2
        lifetime_returns=[1.0, 0.0, 0.5, 0.0, 0.0, 0.0, 0.0, 1.0, 0.0, 0.0],
        ema=tracker)


@pytest.mark.parametrize(("name", "expected"), [
    ("blend", 0.64),              # 0.4 * 1 + 0.6 * 0.4 = 0.4 + 0.24
    ("regret", 1.0),              # clip(0.25 / 0.15) = 1
    ("plateau", 0.4),
    ("learning_potential", 0.125),
    ("solve_rate", 0.2),
    ("azr", 0.8),                 # 1 - 0.2
])
def test_designer_signals(name, expected):
    assert designer_signal(name, _stats()) == approx(expected)


def test_positive_share_input_moves_only_the_plateau():
    share = RewardConfig(win_rate_input="positive_share")
    assert designer_signal("plateau", _stats(), share) == approx(0.6)
    assert designer_signal("blend", _stats(), share) == approx(0.76)   # 0.4 + 0.6 * 0.6
    assert designer_signal("solve_rate", _stats(), share) == approx(0.2)


def test_designer_signal_registry():
    assert set(DESIGNER_SIGNALS) == {"blend", "regret", "plateau", "learning_potential",
                                     "solve_rate", "azr"}
    with pytest.raises(KeyError, match="known"):
        designer_signal("nope", _stats())
    with pytest.raises(ValueError):
        register_designer_signal("blend", lambda s, p: 0.0)
    with pytest.raises(TypeError):
        register_designer_signal("broken", 3)  # type: ignore[arg-type]
    register_designer_signal("constant", lambda s, p: 0.25)
    try:
        assert designer_signal("constant", _stats()) == 0.25
    finally:
        del rewards.DESIGNER_SIGNALS["constant"]


def test_signals_lifetime_defaults_to_generation_step_and_needs_ema():
    stats = EnvStats(returns_with_hint=[1.0, 1.0], returns_without_hint=[1.0, 0.0])
    # win rate 1/2 -> plateau 1 ; regret 1 - 0.5 = 0.5 -> norm 1 ; blend 0.4 + 0.6 = 1
    assert designer_signal("blend", stats) == approx(1.0)
    with pytest.raises(ValueError):
        designer_signal("learning_potential", stats)


# -- the run's reward constants reach the signals (issue 12, defect 1) -------------------------


def _win_rate_03_regret_0075() -> EnvStats:
    # with hint: mean 0.375; without: mean 0.3 -> regret 0.075 -> norm 0.5
    # lifetime no-hint wins (> 0): 3 of 10 -> win rate 0.3
    return EnvStats(returns_with_hint=[0.375] * 8, returns_without_hint=[0.3] * 8,
                    lifetime_returns=[1.0, 1.0, 1.0] + [0.0] * 7)


def test_blend_takes_the_plateau_band_and_weights_from_the_params():
    stats = _win_rate_03_regret_0075()
    # default band [0.4, 0.6]: plateau(0.3) = 1 - 0.1 / 0.25 = 0.6 -> 0.4 * 0.5 + 0.6 * 0.6
    assert designer_signal("blend", stats) == approx(0.56)
    assert designer_signal("blend", stats, RewardConfig()) == approx(0.56)
    # the 4B run's later band [0.2, 0.4]: plateau 1 -> 0.4 * 0.5 + 0.6 * 1
    band = RewardConfig(plateau_low=0.2, plateau_high=0.4)
    assert designer_signal("blend", stats, band) == approx(0.8)
    assert designer_signal("plateau", stats, band) == approx(1.0)
    # every other constant: scale 0.3 -> norm 0.25; weights 0.5/0.5; ramp 0.5 -> plateau 0.8
    assert designer_signal("regret", stats, RewardConfig(regret_scale=0.3)) == approx(0.25)
    assert designer_signal("blend", stats, RewardConfig(regret_weight=0.5, plateau_weight=0.5)) \
        == approx(0.5 * 0.5 + 0.5 * 0.6)
    assert designer_signal("plateau", stats, RewardConfig(plateau_ramp=0.5)) == approx(0.8)


def test_the_reward_config_holds_the_reward_constants():
    params = RewardConfig(plateau_low=0.2, plateau_high=0.4, regret_scale=0.3)
    assert (params.plateau_low, params.plateau_high, params.regret_scale) == (0.2, 0.4, 0.3)
    assert params.regret_weight == 0.4 and params.plateau_ramp == 0.25
    assert params.win_rate_input == "mean_return"
    share = RewardConfig(win_rate_input="positive_share")
    assert share.win_rate_input == "positive_share" and share.win_rate([0.2, 0.0]) == 0.5
    from spadekit.common.errors import ConfigError
    with pytest.raises(ConfigError):
        RewardConfig(win_rate_input="share")


# -- the learning-potential EMAs (issue 12, defect 6) ------------------------------------------


def test_learning_potential_of_per_round_win_rates():
    t = EmaTracker()
    for w in (0.0, 0.25, 0.5, 0.75):
        t.update(w)
    # fast: 0, .075, .2025, .36675 ; slow: 0, .0125, .036875, .07253125
    assert t.learning_potential == approx(0.36675 - 0.07253125)   # 0.294
    # the reference's constants: weights 0.99 / 0.95 of the new value, scale 1 / (2 * 0.04)
    ref = EmaTracker(alpha_fast=0.99, alpha_slow=0.95, scale=12.5)
    for w in (0.0, 0.25, 0.5, 0.75):
        ref.update(w)
    # fast .74747475, slow .73684375 -> 12.5 * 0.010631
    assert ref.learning_potential == approx(12.5 * (0.74747475 - 0.73684375))
    with pytest.raises(ValueError):
        EmaTracker(scale=0.0)


def test_ema_state_without_scale_loads_as_scale_one():
    t = EmaTracker(scale=3.0)
    t.update(0.0)
    t.update(1.0)
    state = t.state_dict()
    assert state["scale"] == 3.0
    old = {k: v for k, v in state.items() if k != "scale"}   # written before scale existed
    resumed = EmaTracker(scale=3.0)
    resumed.load_state_dict(old)
    assert resumed.scale == 1.0 and resumed.learning_potential == approx(0.3 - 0.05)


# -- the win rate above chance (reward.above_chance) ----------------------------------------------
@pytest.mark.parametrize("w, c, expected", [
    (0.5, 1 / 3, 0.25),     # (0.5 - 1/3) / (2/3): a guess among three, an agent at one half
    (1 / 3, 1 / 3, 0.0),    # the guesser itself
    (0.2, 1 / 3, 0.0),      # below chance is 0, not negative
    (0.7, 0.0, 0.7),        # no blind reply earns anything: the win rate as it is
    (1.0, 0.5, 1.0),
    (0.9, 1.0, 0.0),        # a blind reply wins everything: nothing is above it
])
def test_above_chance_by_hand(w, c, expected):
    assert rewards.above_chance(w, c) == approx(expected)


def test_above_chance_refuses_values_outside_the_unit_interval():
    for w, c in ((1.2, 0.0), (0.5, -0.1), (float("nan"), 0.0), (0.5, float("inf"))):
        with pytest.raises(ValueError):
            rewards.above_chance(w, c)


def test_a_copied_answer_leaves_the_plateau_only_above_chance():
    # HiddenNumber(10, 200) + ScoreSteep(5): replying the printed middle earns 0.33 a play
    # (chance 0.33). Reference: plateau(0.33) = 1 - 0.07 / 0.25 = 0.72 -> 0.6 * 0.72 = 0.432;
    # above chance: win rate 0 -> plateau 0 -> 0 (regret 0 either way)
    copier = EnvStats([0.33] * 4, [0.33] * 4, chance=0.33)
    assert designer_signal("blend", copier) == approx(0.432)
    assert designer_signal("blend", copier, RewardConfig(above_chance=True)) == 0.0
    # an agent that plays: 0.66 -> (0.66 - 0.33) / 0.67 = 0.4925 -> in the band -> 0.6
    player = EnvStats([0.66] * 4, [0.66] * 4, chance=0.33)
    assert designer_signal("blend", player, RewardConfig(above_chance=True)) == approx(0.6)
    assert designer_signal("plateau", player, RewardConfig(above_chance=True)) == approx(1.0)
    # unmeasured chance (0): the same as the reference's
    assert designer_signal("blend", EnvStats([0.5], [0.5]), RewardConfig(above_chance=True)) \
        == designer_signal("blend", EnvStats([0.5], [0.5]))


def test_above_chance_comes_from_the_config_and_must_be_a_bool():
    from spadekit.common.errors import ConfigError
    from spadekit.selfplay.config import RewardConfig

    assert (RewardConfig()).above_chance is False
    assert (RewardConfig(above_chance=True)).above_chance is True
    with pytest.raises(ConfigError, match="above_chance"):
        RewardConfig(above_chance="yes")
    with pytest.raises(ConfigError, match="win_rate_input must be mean_return"):
        RewardConfig(above_chance=True, win_rate_input="positive_share")


@given(st.floats(0, 1), st.floats(0, 1), st.floats(0, 1))
def test_above_chance_is_monotone_bounded_and_lowers_the_win_rate(w, w2, c):
    a = rewards.above_chance(w, c)
    assert 0.0 <= a <= 1.0 and a <= w + 1e-12
    lo, hi = sorted((w, w2))
    assert rewards.above_chance(lo, c) <= rewards.above_chance(hi, c) + 1e-12
    assert rewards.above_chance(w, 0.0) == approx(w)
