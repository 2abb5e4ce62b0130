"""The policy-gradient loss of both SPADE roles (SPEC points 7-8), one function per mechanism:

- ``clipped_surrogate``: ``loss_t = -min(r_t * A, clip(r_t, 1 - epsilon, 1 + epsilon_high) * A)``,
  ``r_t = exp(logprob_t - old_logprob_t)``; defaults 0.2 / 0.28 ("clip-higher").
- ``truncated_is_weight``: ``w_t = min(pi_old(t) / pi_behaviour(t), cap)``, cap 2.0, detached,
  multiplying the delayed designer samples' surrogate.
- ``kl_low_var``: the k3 estimator of KL(pi || pi_ref), ``exp(ref - lp) - (ref - lp) - 1``.
- ``aggregate``: "token" = mean over every unmasked token of the batch, "sequence" = mean per
  sequence then over sequences; per-sample weights multiply each sample's tokens.
- ``grpo_loss``: all of it together.

Shapes: logprob tensors and ``mask`` ``[B, T]``, ``advantages`` ``[B]`` or ``[B, T]``,
``sample_weights`` ``[B]``. Masked positions are never read (they may hold inf/nan); only
``logprobs`` carries gradient. Knob names follow TRL's GRPOTrainer.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

__all__ = ["token_logprobs", "clipped_surrogate", "truncated_is_weight", "kl_low_var",
           "aggregate", "grpo_loss", "LOSS_TYPES"]

LOSS_TYPES = ("token", "sequence")


def token_logprobs(logits: Tensor, token_ids: Tensor) -> Tensor:
    """``log softmax(logits)[..., token_ids]``: the logprob of each token, shape of ``token_ids``.

    ``logits[..., t, :]`` must be the distribution that produced ``token_ids[..., t]``: for a
    causal LM, shift first (``logits[:, :-1]`` with ``input_ids[:, 1:]``). Half-precision logits
    are upcast to float32.
    """
    if logits.shape[:-1] != token_ids.shape:
        raise ValueError(f"token_logprobs: logits {tuple(logits.shape)} do not match token_ids "
                         f"{tuple(token_ids.shape)}")
    if logits.dtype in (torch.float16, torch.bfloat16):
        logits = logits.float()
    picked = logits.gather(-1, token_ids.long().unsqueeze(-1)).squeeze(-1)
    return picked - torch.logsumexp(logits, dim=-1)


def _bool_mask(mask: Tensor, like: Tensor) -> Tensor:
    if mask.shape != like.shape:
        raise ValueError(f"mask {tuple(mask.shape)} does not match {tuple(like.shape)}")
    return mask.bool()


def _masked_mean(values: Tensor, mask: Tensor) -> float:
    """Mean of ``values`` over True positions of ``mask`` (0.0 when there are none)."""
    n = int(mask.sum())
    return float(values[mask].sum() / n) if n else 0.0


def clipped_surrogate(logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor, mask: Tensor,
                      epsilon: float = 0.2,
                      epsilon_high: float = 0.28) -> tuple[Tensor, dict[str, float]]:
    """Per-token clipped surrogate loss with clip-higher, zero at masked positions.

    ``ratio = exp(logprobs - old_logprobs)``;
    ``loss = -min(ratio * A, clamp(ratio, 1 - epsilon, 1 + epsilon_high) * A)``.
    Stats (over unmasked tokens): ``clip_frac_low`` = share with ``ratio < 1 - epsilon`` and
    ``A < 0``, ``clip_frac_high`` = share with ``ratio > 1 + epsilon_high`` and ``A > 0`` (the
    tokens whose gradient the clip removes), ``clip_frac`` their sum, ``ratio_mean``.
    """
    if not (0 <= epsilon < 1 and epsilon_high >= 0):
        raise ValueError(f"need 0 <= epsilon < 1 and epsilon_high >= 0, got {epsilon}, "
                         f"{epsilon_high}")
    m = _bool_mask(mask, logprobs)
    adv = advantages.detach().to(logprobs.dtype)
    if adv.dim() == logprobs.dim() - 1:
        adv = adv.unsqueeze(-1)
    adv = adv.expand_as(logprobs)
    zero = torch.zeros((), dtype=logprobs.dtype, device=logprobs.device)
    log_ratio = torch.where(m, logprobs - old_logprobs.detach(), zero)
    ratio = torch.exp(log_ratio)
    clipped = torch.clamp(ratio, 1.0 - epsilon, 1.0 + epsilon_high)
    per_token = -torch.minimum(ratio * adv, clipped * adv)
    per_token = torch.where(m, per_token, zero)
    with torch.no_grad():
        low = (ratio < 1.0 - epsilon) & (adv < 0) & m
        high = (ratio > 1.0 + epsilon_high) & (adv > 0) & m
        n = max(int(m.sum()), 1)
        stats = {"clip_frac_low": float(low.sum()) / n,
                 "clip_frac_high": float(high.sum()) / n,
                 "clip_frac": float((low | high).sum()) / n,
                 "ratio_mean": _masked_mean(ratio, m)}
    return per_token, stats


def truncated_is_weight(old_logprobs: Tensor, behaviour_logprobs: Tensor, cap: float = 2.0,
                        mask: Tensor | None = None) -> Tensor:
    """Truncated importance weight per token: ``min(exp(old - behaviour), cap)``, detached.

    ``old`` is the policy at the start of this update, ``behaviour`` the one that sampled the
    tokens (stored at generation time). Only the top is truncated. Where ``mask`` is False the
    weight is 1.0. A row that needs no correction can pass its ``old_logprobs`` as behaviour:
    its weight is exactly 1.
    """
    if not cap > 0:
        raise ValueError(f"truncated_is_weight: cap must be > 0, got {cap}")
    old = old_logprobs.detach()
    diff = old - behaviour_logprobs.detach().to(old.dtype)
    if mask is not None:
        diff = torch.where(_bool_mask(mask, old), diff, torch.zeros((), dtype=old.dtype,
                                                                      device=old.device))
    # Clamp the log before exponentiating: same result as min(exp(.), cap), never overflows.
    return torch.exp(torch.clamp(diff, max=math.log(cap)))


def kl_low_var(logprobs: Tensor, ref_logprobs: Tensor, mask: Tensor | None = None) -> Tensor:
    """Per-token k3 estimate of KL(pi || pi_ref): ``exp(ref - lp) - (ref - lp) - 1`` (>= 0,
    0 where the two agree). Gradient flows through ``logprobs`` only. 0 where ``mask`` is False.
    """
    d = ref_logprobs.detach().to(logprobs.dtype) - logprobs
    if mask is not None:
        d = torch.where(_bool_mask(mask, logprobs), d,
                        torch.zeros((), dtype=logprobs.dtype, device=logprobs.device))
    return torch.exp(d) - d - 1.0


def aggregate(per_token: Tensor, mask: Tensor, weights: Tensor | None = None,
              loss_type: str = "token") -> Tensor:
    """Reduce a ``[B, T]`` per-token loss to a scalar.

    - ``"token"``: ``sum_b w_b * sum_t mask * loss / (number of unmasked tokens in the batch)``:
      every token counts equally, long sequences count more (DAPO's token-level loss).
    - ``"sequence"``: each sequence's mean over its unmasked tokens, times ``w_b``, averaged over
      the sequences that have at least one unmasked token (original GRPO).

    Weights scale contributions; they do not enter the denominators (so a weight of 32 really is
    32 times the gradient). An all-masked batch gives 0 (still attached to the graph).
    """
    if loss_type not in LOSS_TYPES:
        raise ValueError(f"loss_type must be one of {LOSS_TYPES}, got {loss_type!r}")
    m = _bool_mask(mask, per_token)
    zero = torch.zeros((), dtype=per_token.dtype, device=per_token.device)
    masked = torch.where(m, per_token, zero)
    if weights is not None:
        w = weights.detach().to(per_token.dtype)
        if w.shape != per_token.shape[:1]:
            raise ValueError(f"weights {tuple(w.shape)} must have shape ({per_token.shape[0]},)")
        masked = masked * w.unsqueeze(-1)
    counts = m.sum(dim=-1).to(per_token.dtype)
    if loss_type == "token":
        return masked.sum() / counts.sum().clamp(min=1.0)
    per_seq = masked.sum(dim=-1) / counts.clamp(min=1.0)
    n_seq = (counts > 0).sum().to(per_token.dtype).clamp(min=1.0)
    return per_seq.sum() / n_seq


def grpo_loss(logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor, mask: Tensor, *,
              sample_weights: Tensor | None = None, behaviour_logprobs: Tensor | None = None,
              is_cap: float = 2.0, ref_logprobs: Tensor | None = None, beta: float = 0.0,
              epsilon: float = 0.2, epsilon_high: float = 0.28,
              loss_type: str = "token") -> tuple[Tensor, dict[str, float]]:
    """SPADE's loss for one batch of agent and designer samples: ``loss = aggregate(tis * surrogate,
    mask, sample_weights) + beta * aggregate(kl, mask)``.

    ``tis`` is ``truncated_is_weight(old, behaviour, is_cap)`` where ``behaviour_logprobs`` is
    given, else 1 (rows needing no correction pass their ``old_logprobs``). ``sample_weights`` scale
    the policy-gradient term only. ``beta == 0`` skips the KL (``ref_logprobs`` is not read);
    otherwise ``ref_logprobs`` is required (k3). Stats, unweighted means over unmasked tokens:
    ``pg_loss``, ``clip_frac_low``, ``clip_frac_high``, ``clip_frac``, ``ratio_mean``, ``tis_mean``,
    ``tis_capped_frac``, ``tis_sq_mean``, ``mismatch_kl`` (k3 of KL(behaviour || old)),
    ``num_tokens`` and, when ``beta != 0``, ``kl``.
    """
    m = _bool_mask(mask, logprobs)
    per_token, stats = clipped_surrogate(logprobs, old_logprobs, advantages, m,
                                         epsilon=epsilon, epsilon_high=epsilon_high)
    if behaviour_logprobs is not None:
        tis = truncated_is_weight(old_logprobs, behaviour_logprobs, cap=is_cap, mask=m)
        per_token = per_token * tis
        with torch.no_grad():
            stats["tis_mean"] = _masked_mean(tis, m)
            log_w = old_logprobs.detach() - behaviour_logprobs.detach().to(logprobs.dtype)
            capped = (log_w >= math.log(is_cap)) & m
            stats["tis_capped_frac"] = float(capped.sum()) / max(int(m.sum()), 1)
            stats["tis_sq_mean"] = _masked_mean(tis * tis, m)
            # k3 estimate of KL(behaviour || old) from the behaviour's own samples: the
            # mismatch between the engine that sampled and the trainer (0 where they agree)
            r = torch.clamp(log_w, max=50.0)
            stats["mismatch_kl"] = _masked_mean(torch.exp(r) - r - 1.0, m)
    else:
        stats.update(tis_mean=1.0, tis_capped_frac=0.0, tis_sq_mean=1.0, mismatch_kl=0.0)
    pg = aggregate(per_token, m, sample_weights, loss_type)
    loss = pg
    stats["pg_loss"] = float(pg.detach())
    stats["num_tokens"] = int(m.sum())
    if beta != 0.0:
        if ref_logprobs is None:
            raise ValueError("grpo_loss: beta != 0 needs ref_logprobs")
        kl = kl_low_var(logprobs, ref_logprobs, mask=m)
        loss = loss + beta * aggregate(kl, m, None, loss_type)
        with torch.no_grad():
            stats["kl"] = _masked_mean(kl, m)
    return loss, stats
