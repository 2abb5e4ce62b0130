"""spadekit.selfplay.advantages: every expected number below is worked out by hand in the comments."""

from __future__ import annotations

import math

import pytest

from spadekit.selfplay.advantages import (Sample, agent_advantages, designer_advantages,
                                 designer_weight, drop_without_logprobs)

approx = pytest.approx


# ----- agent: GRPO z-score per environment --------------------------------------------------------
def test_agent_zscore_three_plays():
    # returns 0, 0.5, 1: mean 0.5 ; population var (0.25 + 0 + 0.25) / 3 = 1/6 ;
    # std = sqrt(1/6) = 0.408248290... ; z = -0.5/0.4082 = -1.2247449, 0, +1.2247449
    adv = agent_advantages({"env": [0.0, 0.5, 1.0]})
    assert adv["env"] == approx([-1.2247449, 0.0, 1.2247449], abs=1e-6)


def test_agent_groups_are_independent():
    # env a: 0, 1 -> mean 0.5, std 0.5 -> -1, +1 ; env b: 0.2, 0.2, 0.8 -> mean 0.4,
    # var (0.04 + 0.04 + 0.16) / 3 = 0.08, std 0.2828427 -> -0.7071068, -0.7071068, 1.4142136
    adv = agent_advantages({"a": [0.0, 1.0], "b": [0.2, 0.2, 0.8]})
    assert adv["a"] == approx([-1.0, 1.0], abs=1e-6)
    assert adv["b"] == approx([-0.7071068, -0.7071068, 1.4142136], abs=1e-6)


def test_agent_identical_group_gives_exact_zeros():
    adv = agent_advantages({"same": [0.3, 0.3, 0.3], "one": [1.0], "empty": []})
    assert adv == {"same": [0.0, 0.0, 0.0], "one": [0.0], "empty": []}


def test_agent_eps_enters_denominator():
    # returns 0, 2: mean 1, std 1 ; with eps = 1: (2 - 1) / (1 + 1) = 0.5
    assert agent_advantages({"e": [0.0, 2.0]}, eps=1.0)["e"] == approx([-0.5, 0.5])
    # default eps 1e-8: 1 / (1 + 1e-8) = 0.99999999
    assert agent_advantages({"e": [0.0, 2.0]})["e"][1] == approx(1.0 - 1e-8, rel=1e-12)


def test_agent_rejects_nan():
    with pytest.raises(ValueError):
        agent_advantages({"e": [0.0, math.nan]})


# ----- designer: centring by skill ---------------------------------------------------------------
def test_designer_centring_by_skill():
    # Logic: 0.2, 0.6, 0.7 -> mean 0.5 -> -0.3, 0.1, 0.2 (no std division)
    # Math: 0.9, 0.1 -> mean 0.5 -> 0.4, -0.4 ; Spatial: one sample -> the fallback below
    adv = designer_advantages({"Logic": [0.2, 0.6, 0.7], "Math": [0.9, 0.1], "Spatial": [0.8],
                               "Empty": []})
    assert adv["Logic"] == approx([-0.3, 0.1, 0.2])
    assert adv["Math"] == approx([0.4, -0.4])
    # the round's mean over all six: (0.2 + 0.6 + 0.7 + 0.9 + 0.1 + 0.8) / 6 = 0.55 -> 0.25
    assert adv["Spatial"] == approx([0.25])
    assert adv["Empty"] == []


def test_designer_single_sample_skills_centre_on_the_round_mean():
    """The default preset's shape: 2 programs over 3 skills, one sample per skill. Centring
    within each skill alone would give both 0 (no designer gradient)."""
    # round mean (0.7 + 0.1) / 2 = 0.4 -> 0.3, -0.3
    adv = designer_advantages({"Logic": [0.7], "Math": [0.1], "Spatial": []})
    assert adv == {"Logic": approx([0.3]), "Math": approx([-0.3]), "Spatial": []}
    # a skill of two keeps its own mean; the singleton uses all three: (0.2 + 0.4 + 0.9) / 3
    adv = designer_advantages({"Logic": [0.2, 0.4], "Math": [0.9]})
    assert adv["Logic"] == approx([-0.1, 0.1]) and adv["Math"] == approx([0.4])
    # one designer sample in the whole round: nothing to compare with
    assert designer_advantages({"Logic": [0.7]}) == {"Logic": [0.0]}
    # equal singletons carry no preference
    assert designer_advantages({"Logic": [0.5], "Math": [0.5]}) == {"Logic": [0.0],
                                                                    "Math": [0.0]}


# ----- upweighting --------------------------------------------------------------------------------
def test_designer_weight_paper_setup():
    # 192 / 24 * 4 = 8 * 4 = 32
    assert designer_weight(192, 24, 4) == 32.0


def test_designer_weight_cap():
    # tool use: 192 / 24 * 8 = 64 -> capped at 50
    assert designer_weight(192, 24, 8) == 50.0
    # 10 / 4 * 2 = 5 with a cap of 4 -> 4
    assert designer_weight(10, 4, 2, cap=4.0) == 4.0


def test_designer_weight_bad_inputs():
    with pytest.raises(ValueError):
        designer_weight(192, 0, 4)
    with pytest.raises(ValueError):
        designer_weight(192, 24, 0)


# ----- samples ------------------------------------------------------------------------------------
def _sample(role="designer", logprobs=(-0.1, -0.2, -0.3), **kw) -> Sample:
    return Sample(role=role, group_id="Logic", token_ids=[5, 6, 7], loss_mask=[0, 1, 1],
                  behaviour_logprobs=None if logprobs is None else list(logprobs),
                  advantage=kw.pop("advantage", 0.5), **kw)


def test_sample_validation():
    s = _sample(weight=32.0, generated_at_step=3)
    assert s.num_loss_tokens == 2 and s.weight == 32.0 and s.generated_at_step == 3
    with pytest.raises(ValueError):
        _sample(role="critic")
    with pytest.raises(ValueError):
        _sample(logprobs=(-0.1,))                      # wrong length
    with pytest.raises(ValueError):
        Sample("agent", "env", [1, 2], [1], None, 0.0)  # mask length
    with pytest.raises(ValueError):
        _sample(weight=-1.0)


def test_drop_without_logprobs():
    a_with = _sample()
    a_without = _sample(logprobs=None)
    agent_without = _sample(role="agent", logprobs=None)
    b_with = _sample(advantage=-0.2)
    kept, dropped = drop_without_logprobs([a_with, a_without, agent_without, b_with])
    # only the designer sample without logprobs goes; the on-policy agent sample stays
    assert dropped == 1
    assert kept == [a_with, agent_without, b_with]
    # every role
    kept, dropped = drop_without_logprobs([a_without, agent_without, b_with],
                                          roles=("agent", "designer"))
    assert (kept, dropped) == ([b_with], 2)
    assert drop_without_logprobs([]) == ([], 0)
