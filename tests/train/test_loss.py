"""spadekit.train.loss: every expected number below is worked out by hand in the comments.

Ratios are built as ``logprobs = old + ln(ratio)``; float64 keeps them exact enough for 1e-9.
Clip-higher bounds with the defaults: [1 - 0.2, 1 + 0.28] = [0.8, 1.28].
"""

from __future__ import annotations

import math

import pytest
import torch

from spadekit.train.loss import (aggregate, clipped_surrogate, grpo_loss, kl_low_var,
                                 token_logprobs, truncated_is_weight)

approx = pytest.approx
LN = math.log
RATIOS = [0.7, 0.85, 1.0, 1.25, 1.35]


def t(rows, requires_grad=False):
    return torch.tensor(rows, dtype=torch.float64, requires_grad=requires_grad)


def _ratio_batch():
    """Row 0: advantage +1, row 1: advantage -1, both with the five ratios above."""
    old = torch.zeros(2, 5, dtype=torch.float64)
    lp = t([[LN(r) for r in RATIOS]] * 2, requires_grad=True)
    adv = t([1.0, -1.0])
    mask = torch.ones(2, 5, dtype=torch.bool)
    return lp, old, adv, mask


# ----- token logprobs -----------------------------------------------------------------------------
def test_token_logprobs_hand_values():
    # position 0: logits (0, 0) -> p = (0.5, 0.5), token 0 -> ln 0.5 = -0.693147
    # position 1: logits (0, ln 3) -> p = (1/4, 3/4), token 1 -> ln 0.75 = -0.287682
    logits = t([[[0.0, 0.0], [0.0, LN(3.0)]]])
    out = token_logprobs(logits, torch.tensor([[0, 1]]))
    assert out.tolist()[0] == approx([-0.693147, -0.287682], abs=1e-6)
    half = token_logprobs(logits.to(torch.bfloat16), torch.tensor([[0, 1]]))
    assert half.dtype == torch.float32
    with pytest.raises(ValueError):
        token_logprobs(logits, torch.tensor([[0, 1, 1]]))


# ----- clip-higher surrogate ----------------------------------------------------------------------
def test_clip_higher_values_and_clipped_tokens():
    lp, old, adv, mask = _ratio_batch()
    per_token, stats = clipped_surrogate(lp, old, adv, mask)
    # A = +1: loss = -min(r, clip(r)): 0.7 -> -min(0.7, 0.8) = -0.7 (the clip never binds below
    # for A > 0), 0.85, 1.0, 1.25 inside, 1.35 -> -min(1.35, 1.28) = -1.28 (clipped high)
    assert per_token[0].tolist() == approx([-0.7, -0.85, -1.0, -1.25, -1.28], abs=1e-9)
    # A = -1: loss = max(r, clip(r)): 0.7 -> max(0.7, 0.8) = 0.8 (clipped low), 0.85, 1.0, 1.25,
    # 1.35 -> max(1.35, 1.28) = 1.35 (the clip never binds above for A < 0)
    assert per_token[1].tolist() == approx([0.8, 0.85, 1.0, 1.25, 1.35], abs=1e-9)
    # one token of ten clipped on each side; mean ratio 2 * (0.7+0.85+1+1.25+1.35) / 10 = 1.03
    assert stats["clip_frac_low"] == approx(0.1)
    assert stats["clip_frac_high"] == approx(0.1)
    assert stats["clip_frac"] == approx(0.2)
    assert stats["ratio_mean"] == approx(1.03)


def test_clip_higher_gradients_vanish_only_on_clipped_tokens():
    lp, old, adv, mask = _ratio_batch()
    per_token, _ = clipped_surrogate(lp, old, adv, mask)
    per_token.sum().backward()
    # d(-A * r)/d lp = -A * r where unclipped, 0 where the clipped branch is taken
    assert lp.grad[0].tolist() == approx([-0.7, -0.85, -1.0, -1.25, 0.0], abs=1e-9)
    assert lp.grad[1].tolist() == approx([0.0, 0.85, 1.0, 1.25, 1.35], abs=1e-9)


def test_symmetric_clip_would_cut_ratio_1_25():
    # epsilon_high = 0.2: bound 1.2, so A = +1 at ratio 1.25 -> -1.2 and is clipped too
    lp, old, adv, mask = _ratio_batch()
    per_token, stats = clipped_surrogate(lp, old, adv, mask, epsilon_high=0.2)
    assert per_token[0, 3].item() == approx(-1.2)
    assert stats["clip_frac_high"] == approx(0.2)


def test_surrogate_masked_positions_are_zero_even_with_garbage():
    lp = t([[0.0, 0.0]], requires_grad=True)
    old = t([[0.0, math.nan]])
    per_token, stats = clipped_surrogate(lp, old, t([2.0]), torch.tensor([[1, 0]]))
    # ratio 1 at the kept token: -2 ; masked token: 0 (its nan never read)
    assert per_token.tolist() == [[-2.0, 0.0]]
    assert stats["ratio_mean"] == 1.0
    per_token.sum().backward()
    assert lp.grad.tolist() == [[-2.0, 0.0]]


# ----- truncated importance sampling --------------------------------------------------------------
def test_truncated_is_weight_cap_and_below():
    # old - behaviour = ln 3, ln 1.5, 0, ln 0.5, ln 2, 1000 -> 3 -> 2 (cap), 1.5, 1, 0.5, 2, 2
    old = t([[LN(3.0), LN(1.5), 0.0, LN(0.5), LN(2.0), 1000.0]], requires_grad=True)
    behaviour = torch.zeros(1, 6, dtype=torch.float64)
    w = truncated_is_weight(old, behaviour)
    assert w.tolist()[0] == approx([2.0, 1.5, 1.0, 0.5, 2.0, 2.0], abs=1e-12)
    assert not w.requires_grad                       # detached
    # custom cap 1.2: 3 -> 1.2, 1.5 -> 1.2, 1 -> 1, 0.5 stays
    assert truncated_is_weight(old, behaviour, cap=1.2).tolist()[0][:4] == approx(
        [1.2, 1.2, 1.0, 0.5], abs=1e-12)
    # masked position -> 1.0
    mask = torch.tensor([[1, 0, 1, 1, 1, 1]])
    assert truncated_is_weight(old, behaviour, mask=mask)[0, 1].item() == 1.0


# ----- k3 KL --------------------------------------------------------------------------------------
def test_kl_low_var_hand_values():
    lp = t([[0.0, 0.0, LN(0.5)]])
    ref = t([[0.0, LN(0.5), 0.0]])
    kl = kl_low_var(lp, ref)
    # equal -> e^0 - 0 - 1 = 0
    # ref - lp = ln 0.5 -> 0.5 - (-0.693147) - 1 = 0.193147
    # ref - lp = ln 2   -> 2 - 0.693147 - 1 = 0.306853
    assert kl.tolist()[0] == approx([0.0, 0.193147, 0.306853], abs=1e-6)


# ----- aggregation --------------------------------------------------------------------------------
RAGGED = [[1.0, 2.0, 3.0], [4.0, 50.0, 60.0], [7.0, 8.0, 9.0]]
RAGGED_MASK = [[1, 1, 1], [1, 0, 0], [0, 0, 0]]   # lengths 3, 1, 0


def test_aggregate_token_vs_sequence_on_ragged_mask():
    x, m = t(RAGGED), torch.tensor(RAGGED_MASK)
    # token: (1 + 2 + 3 + 4) / 4 unmasked tokens = 2.5 (masked 50, 60 and row 3 never count)
    assert aggregate(x, m, loss_type="token").item() == approx(2.5)
    # sequence: row means 2 and 4; the empty row is left out -> 3
    assert aggregate(x, m, loss_type="sequence").item() == approx(3.0)
    with pytest.raises(ValueError):
        aggregate(x, m, loss_type="dr_grpo")


def test_aggregate_sample_weights():
    x, m = t(RAGGED), torch.tensor(RAGGED_MASK)
    w = t([0.5, 3.0, 100.0])
    # token: (0.5 * 6 + 3 * 4) / 4 = (3 + 12) / 4 = 3.75 (weights stay out of the denominator)
    assert aggregate(x, m, w, "token").item() == approx(3.75)
    # sequence: (0.5 * 2 + 3 * 4) / 2 = 6.5
    assert aggregate(x, m, w, "sequence").item() == approx(6.5)


def test_aggregate_all_masked_is_zero():
    x = t([[1.0, 2.0]], requires_grad=True)
    out = aggregate(x, torch.zeros(1, 2, dtype=torch.bool))
    assert out.item() == 0.0 and out.requires_grad


# ----- the whole loss -----------------------------------------------------------------------------
def _mixed_batch():
    """Row 0, agent: A = +1, ratios 1 and 1.25, last position padding (nan everywhere but lp),
    no TIS (behaviour = old), weight 1. Row 1, designer: A = +0.5, ratios 1, 1, 1,
    old - behaviour = ln 3, ln 1.5, 0 -> TIS 2 (cap), 1.5, 1; weight 32."""
    nan = math.nan
    lp = t([[0.0, LN(1.25), 0.0], [-1.0, -1.0, -1.0]], requires_grad=True)
    old = t([[0.0, 0.0, nan], [-1.0, -1.0, -1.0]], requires_grad=True)
    behaviour = t([[0.0, 0.0, nan], [-1.0 - LN(3.0), -1.0 - LN(1.5), -1.0]], requires_grad=True)
    # ref - lp: row 0 token 0 = ln 0.5 (k3 0.193147), row 1 token 2 = ln 2 (k3 0.306853)
    ref = t([[LN(0.5), LN(1.25), nan], [-1.0, -1.0, -1.0 + LN(2.0)]], requires_grad=True)
    adv = t([1.0, 0.5], requires_grad=True)
    weights = t([1.0, 32.0], requires_grad=True)
    mask = torch.tensor([[1, 1, 0], [1, 1, 1]])
    return lp, old, behaviour, ref, adv, weights, mask


def test_grpo_loss_token_level_by_hand():
    lp, old, behaviour, ref, adv, weights, mask = _mixed_batch()
    loss, stats = grpo_loss(lp, old, adv, mask, sample_weights=weights,
                            behaviour_logprobs=behaviour)
    # row 0: -1 * 1, -1 * 1.25 -> -2.25 ; row 1: -0.5 * (2, 1.5, 1) * 32 = -32, -24, -16 -> -72
    # token mean over 5 tokens: -74.25 / 5 = -14.85
    assert loss.item() == approx(-14.85)
    assert stats["pg_loss"] == approx(-14.85)
    assert stats["num_tokens"] == 5
    assert stats["ratio_mean"] == approx(1.05)           # (1 + 1.25 + 1 + 1 + 1) / 5
    assert stats["tis_mean"] == approx(1.3)              # (1 + 1 + 2 + 1.5 + 1) / 5
    assert stats["tis_capped_frac"] == approx(0.2)       # 1 of 5
    assert stats["clip_frac"] == 0.0                     # 1.25 < 1.28
    assert "kl" not in stats                             # beta = 0: no KL at all
    loss.backward()
    # d/d lp = -A * r * tis * w / 5: row 0 -> -0.2, -0.25, 0 ; row 1 -> -6.4, -4.8, -3.2
    assert lp.grad.tolist()[0] == approx([-0.2, -0.25, 0.0], abs=1e-9)
    assert lp.grad.tolist()[1] == approx([-6.4, -4.8, -3.2], abs=1e-9)


def test_grpo_loss_sequence_level_by_hand():
    lp, old, behaviour, ref, adv, weights, mask = _mixed_batch()
    loss, _ = grpo_loss(lp, old, adv, mask, sample_weights=weights,
                        behaviour_logprobs=behaviour, loss_type="sequence")
    # row means: -2.25 / 2 = -1.125 and -72 / 3 = -24 -> (-1.125 - 24) / 2 = -12.5625
    assert loss.item() == approx(-12.5625)


def test_grpo_loss_with_kl_and_gradient_only_through_logprobs():
    lp, old, behaviour, ref, adv, weights, mask = _mixed_batch()
    loss, stats = grpo_loss(lp, old, adv, mask, sample_weights=weights,
                            behaviour_logprobs=behaviour, ref_logprobs=ref, beta=0.1)
    # KL per token: 0.193147 + 0.306853 = 0.5 over 5 tokens -> 0.1 (sample weights not applied)
    # loss = -14.85 + 0.1 * 0.1 = -14.84
    assert stats["kl"] == approx(0.1)
    assert loss.item() == approx(-14.84)
    loss.backward()
    # KL gradient: d k3 / d lp = 1 - e^(ref - lp), times beta / 5 tokens:
    # row 0 token 0: (1 - 0.5) * 0.02 = +0.01 -> -0.2 + 0.01 = -0.19
    # row 1 token 2: (1 - 2) * 0.02 = -0.02 -> -3.2 - 0.02 = -3.22
    assert lp.grad.tolist()[0] == approx([-0.19, -0.25, 0.0], abs=1e-9)
    assert lp.grad.tolist()[1] == approx([-6.4, -4.8, -3.22], abs=1e-9)
    assert torch.isfinite(lp.grad).all()
    for other in (old, behaviour, ref, adv, weights):
        assert other.grad is None


def test_grpo_loss_beta_needs_reference():
    lp, old, _, _, adv, _, mask = _mixed_batch()
    with pytest.raises(ValueError):
        grpo_loss(lp, old.detach().nan_to_num(0.0), adv, mask, beta=0.1)


def test_grpo_loss_without_tis_or_weights():
    lp, old, adv, mask = _ratio_batch()
    loss, stats = grpo_loss(lp, old, adv, mask)
    # sum of the ten per-token losses: (-5.08) + 5.25 = 0.17 -> / 10 = 0.017
    assert loss.item() == approx(0.017)
    assert stats["tis_mean"] == 1.0 and stats["tis_capped_frac"] == 0.0
