"""spadekit samples as slime samples and back, and slime's batch padding (no slime import).

Field mapping (slime v0.3.0, ``slime/utils/types.py``): ``tokens`` = prompt + response;
``response_length`` = tokens from the first loss token on (``response_start``); ``loss_mask``
over the response only (observation tokens inside it stay 0); ``rollout_log_probs`` over the
response; ``reward`` = advantage x weight x reward_scale (slime's surrogate and TIS are linear
in the advantage, so the designer's upweighting travels exactly); ``train_metadata`` carries
role, spadekit group, weight, the unscaled advantage, generated step and delay; ``status``
completed or truncated. ``pad_to_global_batch`` fills a partial global batch with inert copies
(loss mask all 0) and rescales the real rewards so the step's objective is unchanged. The
rest of the adapter (rollout function, data source, launcher) is ``spadekit.integrations.slime``.
"""

from __future__ import annotations

import copy
import math
from typing import Any, Sequence

from spadekit.selfplay.advantages import Sample

__all__ = ["STATUS_COMPLETED", "STATUS_TRUNCATED", "from_slime_sample", "pad_to_global_batch",
           "response_start", "slime_step_losses", "to_slime_sample"]

STATUS_COMPLETED = "completed"
STATUS_TRUNCATED = "truncated"
"""``Sample.Status`` values (``slime/utils/types.py:36-45``); dicts carry the string."""


# ---------------------------------------------------------------------------------------------
# sample conversion


def response_start(loss_mask: Sequence[int]) -> int:
    """Where slime's response begins: the first loss token. Everything before it (system prompt,
    first observation, chat-template header) is slime's prompt; everything from it to the end is
    the response, observation tokens of later turns included (loss mask 0 there)."""
    for i, m in enumerate(loss_mask):
        if m:
            return i
    raise ValueError("a sample without loss tokens has no response for slime (drop it first)")


def to_slime_sample(sample: Sample, index: int, *, step: int | None = None,
                    reward_scale: float = 1.0, require_logprobs: bool = True) -> dict[str, Any]:
    """One spadekit ``Sample`` as the fields of a slime ``Sample`` (a plain dict; the slime glue
    builds the object). Fields (``slime/utils/types.py:10-56``):

    - ``tokens``: the whole sequence, unchanged; ``response_length = len(tokens) - start``
      where ``start = response_start(loss_mask)``;
    - ``loss_mask``, ``rollout_log_probs``: spadekit's per-token lists from ``start`` on, so
      ``loss_mask[j]`` and ``rollout_log_probs[j]`` belong to ``tokens[start + j]`` (slime scores
      response token ``j`` with the logits at ``start + j - 1``, as spadekit's trainer does);
    - ``reward``: ``advantage * weight * reward_scale`` (see the module docstring);
    - ``status``: ``"truncated"`` for a truncated episode, else ``"completed"``;
    - ``index`` and ``group_id``: ``index`` (every sample its own slime group);
    - ``train_metadata``: role, spadekit group, weight, unscaled advantage, reward scale,
      ``generated_at_step`` and, with ``step``, ``delayed_by = step - generated_at_step``.

    ``require_logprobs``: a sample without behaviour logprobs cannot be importance-corrected
    (``--use-tis`` needs ``rollout_log_probs`` on every sample): ``ValueError``. With False it
    converts with ``rollout_log_probs = None``.
    """
    if not (math.isfinite(reward_scale) and reward_scale >= 0):
        raise ValueError(f"reward_scale must be finite and >= 0, got {reward_scale}")
    start = response_start(sample.loss_mask)
    if sample.behaviour_logprobs is None:
        if require_logprobs:
            raise ValueError(f"{sample.role} sample of group {sample.group_id!r} has no behaviour "
                             "logprobs; slime's TIS needs rollout_log_probs on every sample")
        logprobs = None
    else:
        logprobs = [float(x) for x in sample.behaviour_logprobs[start:]]
    meta: dict[str, Any] = {
        "role": sample.role, "spade_group": sample.group_id, "weight": float(sample.weight),
        "advantage": float(sample.advantage), "reward_scale": float(reward_scale),
        "generated_at_step": int(sample.generated_at_step), "prompt_length": start,
        "inert": False}
    if step is not None:
        meta["delayed_by"] = int(step) - int(sample.generated_at_step)
    return {
        "group_index": index, "index": index, "group_id": index,
        "prompt": "", "tokens": list(sample.token_ids),
        "response": "", "response_length": len(sample.token_ids) - start,
        "label": None,
        "reward": float(sample.advantage) * float(sample.weight) * float(reward_scale),
        "loss_mask": [int(m) for m in sample.loss_mask[start:]],
        "rollout_log_probs": logprobs,
        "remove_sample": False,
        "status": STATUS_TRUNCATED if sample.truncated else STATUS_COMPLETED,
        "metadata": {},
        "train_metadata": meta,
    }


def _field(obj: Any, name: str, default: Any = None) -> Any:
    if isinstance(obj, dict):
        return obj.get(name, default)
    return getattr(obj, name, default)


def _status(obj: Any) -> str:
    status = _field(obj, "status", STATUS_COMPLETED)
    return getattr(status, "value", status)


def from_slime_sample(obj: Any) -> Sample:
    """A slime sample (the dict of ``to_slime_sample`` or a real ``slime.utils.types.Sample``)
    back as a spadekit ``Sample``. The prompt part gets loss mask 0 and logprob 0.0 (spadekit
    ignores logprobs at masked positions). The advantage is the unscaled one kept in
    ``train_metadata``; without it (a sample slime made itself), ``reward`` is the advantage,
    the role ``agent`` and the weight 1."""
    tokens = list(_field(obj, "tokens") or [])
    n = int(_field(obj, "response_length", 0))
    if not 0 < n <= len(tokens):
        raise ValueError(f"response_length {n} does not fit {len(tokens)} tokens")
    start = len(tokens) - n
    mask = _field(obj, "loss_mask")
    mask = [1] * n if mask is None else [int(m) for m in mask]
    if len(mask) != n:
        raise ValueError(f"loss mask length {len(mask)} != response length {n}")
    lps = _field(obj, "rollout_log_probs")
    if lps is not None and len(lps) != n:
        raise ValueError(f"{len(lps)} rollout logprobs for a response of {n} tokens")
    meta = _field(obj, "train_metadata") or {}
    reward = _field(obj, "reward")
    advantage = meta.get("advantage", reward)
    return Sample(role=meta.get("role", "agent"),
                  group_id=str(meta.get("spade_group", _field(obj, "group_id"))),
                  token_ids=tokens, loss_mask=[0] * start + mask,
                  behaviour_logprobs=None if lps is None else [0.0] * start + [float(x)
                                                                              for x in lps],
                  advantage=float(advantage), weight=float(meta.get("weight", 1.0)),
                  generated_at_step=int(meta.get("generated_at_step", 0)),
                  truncated=_status(obj) == STATUS_TRUNCATED)


# ---------------------------------------------------------------------------------------------
# global-batch padding


def _denominator(sample: dict, per_token_loss: bool) -> float:
    """A sample's share of slime's step normaliser: 1 sample (per-sample mode) or its loss
    tokens clamped to >= 1 (per-token mode: ``loss.py:1172``, ``clamp_min(mask.sum(), 1)``)."""
    return max(sum(sample["loss_mask"]), 1) if per_token_loss else 1


def _inert_copy(sample: dict, index: int) -> dict:
    pad = copy.deepcopy(sample)
    pad.update(index=index, group_index=index, group_id=index, reward=0.0, remove_sample=True,
               loss_mask=[0] * pad["response_length"])
    pad["train_metadata"] = {**pad["train_metadata"], "inert": True, "advantage": 0.0,
                             "reward_scale": 0.0}
    return pad


def pad_to_global_batch(samples: Sequence[dict], global_batch_size: int, *,
                        per_token_loss: bool = False,
                        overflow: str = "steps") -> tuple[list[dict], dict[str, Any]]:
    """Make a batch that slime trains on in full, with the same objective as unpadded.

    slime trains ``len // global_batch_size`` steps of ``global_batch_size`` groups each and
    drops the rest (every sample here is its own group). A partial last step (``n_last``
    samples) is filled with inert copies of its shortest sample (loss mask all 0, reward 0,
    ``remove_sample``), and the real rewards of that step are multiplied by:

    - per-sample mode (slime's default): ``global_batch_size / n_last``, because slime divides
      the step's summed per-sample means by ``global_batch_size``;
    - per-token mode (``--calculate-per-token-loss``): ``(D + n_pad) / D`` where ``D`` is the sum
      over the step's real samples of ``max(loss tokens, 1)``: slime's token normaliser counts
      every sample as at least one token, so each inert copy adds 1 to it.

    Then the step's objective (``slime_step_losses``) equals that of the unpadded samples
    trained as one step. Full steps are untouched. ``overflow="steps"`` keeps everything (more
    than one optimizer step per rollout when there are more samples than one global batch);
    ``"trim"`` keeps only the first ``global_batch_size`` samples, as the SPADE reference does
    (put designer samples first). Samples are renumbered ``index = group_id = position``.
    Returns ``(batch, info)`` with ``n_real``, ``n_pad``, ``n_trimmed``, ``reward_scale`` (of the
    partial step, 1.0 when none) and ``steps``.
    """
    if global_batch_size < 1:
        raise ValueError(f"global_batch_size must be >= 1, got {global_batch_size}")
    if overflow not in ("steps", "trim"):
        raise ValueError(f"overflow must be 'steps' or 'trim', got {overflow!r}")
    if not samples:
        raise ValueError("nothing to pad: slime needs at least one real sample per rollout")
    batch = [copy.deepcopy(dict(s)) for s in samples]
    n_trimmed = 0
    if overflow == "trim" and len(batch) > global_batch_size:
        n_trimmed = len(batch) - global_batch_size
        batch = batch[:global_batch_size]
    n_last = len(batch) % global_batch_size
    n_pad = (global_batch_size - n_last) if n_last else 0
    scale = 1.0
    if n_pad:
        last = batch[len(batch) - n_last:]
        if per_token_loss:
            d = sum(_denominator(s, True) for s in last)
            scale = (d + n_pad) / d
        else:
            scale = global_batch_size / n_last
        for s in last:
            s["reward"] = float(s["reward"]) * scale
            s["train_metadata"] = {**s["train_metadata"],
                                   "reward_scale": s["train_metadata"].get("reward_scale", 1.0)
                                   * scale}
        template = min(last, key=lambda s: len(s["tokens"]))
        batch += [_inert_copy(template, 0) for _ in range(n_pad)]
    for i, s in enumerate(batch):
        s["index"] = s["group_index"] = s["group_id"] = i
    return batch, {"n_real": len(batch) - n_pad, "n_pad": n_pad, "n_trimmed": n_trimmed,
                   "reward_scale": scale, "steps": len(batch) // global_batch_size}


def slime_step_losses(samples: Sequence[dict], token_losses: Sequence[Sequence[float]],
                      global_batch_size: int, *, per_token_loss: bool = False) -> list[float]:
    """A model of how slime v0.3.0 reduces per-token policy losses to one loss per training
    step, for checking the padding and weight rules without slime (``cp_utils.py:53-97``,
    ``loss.py:1140-1218``, ``dp_schedule.py``; one DP rank, no context parallelism).

    ``token_losses[i][j]`` is sample i's loss at response token j (e.g. the clipped surrogate
    times its TIS factor). Steps are consecutive chunks of ``global_batch_size`` samples (one
    sample per group); a trailing partial chunk is dropped, as slime drops it. Per step:

    - per-sample mode: ``sum_i (sum_j mask_ij l_ij / max(sum_j mask_ij, 1)) / global_batch_size``;
    - per-token mode: ``sum_ij mask_ij l_ij / sum_i max(sum_j mask_ij, 1)``.
    """
    out = []
    for k in range(len(samples) // global_batch_size):
        chunk = range(k * global_batch_size, (k + 1) * global_batch_size)
        num = 0.0
        den = 0.0
        for i in chunk:
            mask = samples[i]["loss_mask"]
            if len(token_losses[i]) != len(mask):
                raise ValueError(f"sample {i}: {len(token_losses[i])} losses for "
                                 f"{len(mask)} response tokens")
            total = math.fsum(m * x for m, x in zip(mask, token_losses[i]))
            if per_token_loss:
                num += total
                den += _denominator(samples[i], True)
            else:
                num += total / max(sum(mask), 1)
        out.append(num / den if per_token_loss else num / global_batch_size)
    return out
