"""The statistics of the learning benchmark and test (spadekit.selfplay.learning): the paired bootstrap
interval of an after-minus-before gain, and win rate."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from spadekit.selfplay.learning import held_out_seeds, mean, paired_gain_ci, win_rate

scores = st.lists(st.floats(0, 1), min_size=1, max_size=30)


@settings(max_examples=100, deadline=None)
@given(st.data())
def test_interval_holds_the_gain_and_ties_give_zero(data):
    before = data.draw(scores)
    after = data.draw(st.lists(st.floats(0, 1), min_size=len(before), max_size=len(before)))
    gain, low, high = paired_gain_ci(before, after, resamples=300)
    assert gain == pytest.approx(mean(after) - mean(before), rel=1e-9, abs=1e-12)
    assert low <= high and -1 <= low and high <= 1
    assert paired_gain_ci(before, before, resamples=50) == (0.0, 0.0, 0.0)


def test_a_constant_shift_has_a_point_interval_and_win_rate_counts_positive_returns():
    gain, low, high = paired_gain_ci([0.1, 0.2, 0.3], [0.3, 0.4, 0.5], resamples=200)
    assert gain == pytest.approx(0.2, rel=1e-9)
    assert low == pytest.approx(0.2, rel=1e-9) and high == pytest.approx(0.2, rel=1e-9)
    assert win_rate([0.0, 0.5, 1.0, 0.0]) == 0.5
    _, wlow, whigh = paired_gain_ci([0, 0, 0, 0], [1, 1, 0, 0], stat=win_rate, resamples=500)
    assert 0 <= wlow <= 0.5 <= whigh <= 1


def test_held_out_seeds_lie_above_grpo_round_training_seeds_and_lists_must_pair():
    seeds = held_out_seeds(5)
    assert len(set(seeds)) == 5 and min(seeds) >= 1_000_000
    with pytest.raises(ValueError):
        paired_gain_ci([0.1], [0.1, 0.2])
