"""The check after a weight push: does the engine serve the trainer's NEW weights, not the old?

One optimizer step at a paper learning rate moves a probe's logprobs less than an engine's own
numeric noise, so agreement with the new weights alone cannot tell a stale engine from a fresh
one. ``read_engine`` takes the engine's greedy token and logprob after ``PROBE_CONTEXTS`` fixed
contexts, ``read_model`` the trainer's full distributions there; ``judge`` compares the engine
with the trainer's new AND old readings and says ``pass``, ``indistinct`` (the update is under
this engine's noise: kept, counted, never called a pass) or ``fail`` (the engine is not closer
to the new weights than to the old; or its reading is bit for bit unchanged while the trainer's
moved by ``MOVE``; or, after indistinct checks, the updates since the last verified reading add
up and the engine still sits there). Stateless: the readings are kept by the caller
(``spadekit.train.weight_sync``). The rules and measurements: docs/scaling.md ("Weight sync").
"""

from __future__ import annotations

import math
from typing import Any

from spadekit.policy.base import GenerationRequest, SamplingParams, encode_text
from spadekit.policy.weight_items import WeightSyncError

PROBE_TEXT = ("Her notebook listed, in no particular order: lantern, orbit, velvet, cactus, "
              "thunder, pickle, harbor,")
"""A list of unrelated words: next tokens the model is unsure of move most with its weights."""
PROBE_CONTEXTS = 8
TOLERANCE = {"float32": 2e-3, "float64": 2e-3, "bfloat16": 0.15, "float16": 0.15}
FLOOR = {"float32": 1e-6, "float64": 1e-9, "bfloat16": 1e-4, "float16": 1e-4}
"""The least noise assumed, whatever the previous check measured (float32 hf engine: 0 to 5e-7;
float32 vLLM on CPU: 1.4e-5 to 2e-5; bfloat16 hf: 0 to 3e-5)."""
SEPARATION = 4.0
"""How many noise levels the change must span for a pass or a fail."""
MOVE = {"float32": 1e-4, "float64": 1e-4, "bfloat16": 1e-2, "float16": 1e-2}
"""A change of the trainer's reading this large always moves an engine of the dtype: an engine
whose reading stayed bit for bit the same did not get the push, even where its noise hides the
size of the change."""


# -- readings ----------------------------------------------------------------------------------

def probe_contexts(tokenizer: Any, count: int = PROBE_CONTEXTS) -> list[list[int]]:
    """The last ``count`` prefixes of ``PROBE_TEXT`` (token ids), shortest first."""
    ids = encode_text(tokenizer, PROBE_TEXT)
    count = max(1, min(int(count), len(ids) - 1))
    return [list(ids[:m]) for m in range(len(ids) - count + 1, len(ids) + 1)]


def read_engine(policy: Any, contexts: list[list[int]]) -> tuple[list[int], list[float]]:
    """The engine's greedy next token after each context and its logprob; ``-1`` and NaN where
    it returned none. One ``generate`` call per context: a batch's padding alone moves an hf
    engine's bfloat16 logprobs by 0.11 (alone they equal the trainer's exactly), and a batch
    of one is the same computation every time. Raises what ``generate`` raises."""
    gens = [policy.generate([GenerationRequest(prompt_ids=list(c), params=SamplingParams(
        temperature=0.0, max_new_tokens=1))])[0] for c in contexts]
    tokens, lps = [], []
    for g in gens:
        ok = bool(g.token_ids) and g.logprobs is not None and len(g.logprobs) >= 1
        tokens.append(int(g.token_ids[0]) if ok else -1)
        lps.append(float(g.logprobs[0]) if ok else math.nan)
    return tokens, lps


def read_model(model: Any, contexts: list[list[int]]) -> Any:
    """The trained model's ``log_softmax`` after each context, float32 on the CPU, shape
    ``(len(contexts), vocab)``: one forward pass over the longest context (the contexts are its
    prefixes), as the trainer computes it."""
    import torch

    longest = max(contexts, key=len)
    ids = torch.tensor([longest], device=next(model.parameters()).device)
    was_training = model.training
    model.eval()
    try:
        with torch.inference_mode():
            logits = model(input_ids=ids).logits[0].float()
    finally:
        model.train(was_training)
    logp = torch.log_softmax(logits, dim=-1)
    return torch.stack([logp[len(c) - 1] for c in contexts]).cpu()


# -- the verdict ---------------------------------------------------------------------------------

def judge(tokens: list[int], engine: list[float], new: Any, old: Any | None, *,
          noise: float | None, tolerance: float,
          previous: tuple[list[int], list[float]] | None = None,
          move: float = math.inf, verified: Any | None = None,
          unverified: int = 0) -> dict[str, Any]:
    """The verdict on one reading (module docstring; docs/scaling.md): ``tokens``/``engine`` from
    ``read_engine``, ``new``/``old`` full distributions from ``read_model`` (``old`` None: no
    old reading), ``previous`` the engine's own reading at the old weights, ``move`` the change
    that always shows in the engine (``MOVE``), ``verified`` the trainer's distributions at the
    last version the engine was verified on (or first read on), ``unverified`` the checks since
    then that were indistinct. Returns ``{"verdict": "pass" | "indistinct" | "fail", "reason",
    "dist_new", "dist_old", "change", "noise", "contexts", "dist_verified", "cumulative"}``
    (NaN where a distance is undefined)."""
    vocab = int(new.shape[-1])
    usable = [j for j, t in enumerate(tokens) if 0 <= t < vocab and math.isfinite(engine[j])]
    out: dict[str, Any] = {"contexts": len(usable), "dist_old": math.nan, "change": math.nan,
                           "noise": math.nan if noise is None else float(noise),
                           "dist_verified": math.nan, "cumulative": math.nan}
    if not usable:
        return {**out, "verdict": "fail", "dist_new": math.nan,
                "reason": "the engine returned no token with a finite logprob"}
    e = [engine[j] for j in usable]
    n = [float(new[j, tokens[j]]) for j in usable]
    dist_new = max(abs(a - b) for a, b in zip(e, n))
    out["dist_new"] = dist_new
    if not dist_new <= tolerance:  # NaN fails too
        return {**out, "verdict": "fail",
                "reason": f"the engine's logprobs differ from the trainer's new ones by up to "
                          f"{dist_new:.3g} (tolerance {tolerance:g})"}
    if old is None or noise is None:
        return {**out, "verdict": "indistinct",
                "reason": "no earlier reading of this engine to tell old weights from new"}
    o = [float(old[j, tokens[j]]) for j in usable]
    dist_old = max(abs(a - b) for a, b in zip(e, o))
    change = max(abs(a - b) for a, b in zip(n, o))
    out.update(dist_old=dist_old, change=change)
    if previous is not None and change >= move and len(previous[0]) == len(tokens) and all(
            tokens[j] == previous[0][j] and engine[j] == previous[1][j] for j in usable):
        return {**out, "verdict": "fail",
                "reason": f"the engine's reading is bit for bit what it was before the push, "
                          f"while the trainer's moved by {change:.3g}: the push did not arrive"}
    if not change >= SEPARATION * noise:
        if verified is not None and unverified > 0:
            return _since_verified(out, e, n, [float(verified[j, tokens[j]]) for j in usable],
                                   noise, unverified)
        return {**out, "verdict": "indistinct",
                "reason": f"the update moves the probe by {change:.3g}, under {SEPARATION:g}x "
                          f"this engine's noise ({noise:.3g}): old and new look alike"}
    if dist_old - dist_new >= change / 2:
        return {**out, "verdict": "pass", "reason": "closer to the new weights than the old"}
    return {**out, "verdict": "fail",
            "reason": f"the engine is not closer to the new weights than to the old ones "
                      f"(from the new: {dist_new:.3g}, from the old: {dist_old:.3g}, the "
                      f"update moves the probe by {change:.3g}): the push did not arrive whole"}


def _since_verified(out: dict[str, Any], e: list[float], n: list[float], v: list[float],
                    noise: float, unverified: int) -> dict[str, Any]:
    """The verdict of a check too small to see after ``unverified`` indistinct ones: the same
    test against the last verified reading ``v``, with the change since then (several small
    updates add up; an engine that dropped them all sits on ``v``)."""
    dist_v = max(abs(a - b) for a, b in zip(e, v))
    cumulative = max(abs(a - b) for a, b in zip(n, v))
    out = {**out, "dist_verified": dist_v, "cumulative": cumulative}
    checks = f"{unverified + 1} checks"
    if not cumulative >= SEPARATION * noise:
        return {**out, "verdict": "indistinct",
                "reason": f"the update moves the probe by {out['change']:.3g}, and the "
                          f"{checks} since the last verified reading by {cumulative:.3g}, "
                          f"under {SEPARATION:g}x this engine's noise ({noise:.3g}): old and "
                          "new look alike"}
    if dist_v - out["dist_new"] >= cumulative / 2:
        return {**out, "verdict": "pass",
                "reason": f"closer to the new weights than to those verified {checks} ago"}
    return {**out, "verdict": "fail",
            "reason": f"the engine is not closer to the new weights than to those it was last "
                      f"verified on, {checks} ago (from the new: {out['dist_new']:.3g}, from "
                      f"the verified: {dist_v:.3g}, the updates since then move the probe by "
                      f"{cumulative:.3g}): the pushes since then did not arrive"}


# -- the reference -------------------------------------------------------------------------

def reference_model(source: Any) -> Any:
    """The trained ``nn.Module`` to score the probe with (a ``PolicyTrainer``, an ``HFPolicy``
    or a model), or None when there is none. Under FSDP the model must hold its full weights
    (inside ``trainer.gathered_for_generation()``): ``WeightSyncError`` otherwise."""
    import torch

    if isinstance(source, torch.nn.Module):
        model = source
    else:  # a trainer (its policy's model runs the adapters) or a policy
        model = getattr(getattr(source, "policy", None), "model", None)
        if model is None:
            model = getattr(source, "model", None)
    model = getattr(model, "module", model)  # DDP
    if not isinstance(model, torch.nn.Module):
        return None
    if any(type(p).__name__ == "DTensor" for p in model.parameters()):
        raise WeightSyncError(
            "the trained model's weights are sharded (FSDP): push and check them inside "
            "trainer.gathered_for_generation() on every rank, as the self-play loop does "
            "(nothing was pushed)")
    return model
