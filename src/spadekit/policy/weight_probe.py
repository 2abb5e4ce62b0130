"""The check after every weight push: does the engine now serve the NEW weights, not the old?

A push can "succeed" and change nothing (a dropped push, a CPU vLLM whose ``param.data`` was
written, a server that reloaded the wrong directory, a stale prefix cache). One optimizer step
at a paper learning rate (1e-6) moves a probe's logprobs by about 2e-3 on SmolLM2 and 4e-5 on
the tiny model, less than any fixed tolerance that also absorbs the engine's numeric noise, so
agreement with the trainer alone cannot tell a stale engine from a fresh one. The probe compares
the engine with the trainer's logprobs under both the new and the old weights.

The reading: ``PROBE_CONTEXTS`` fixed contexts (the last prefixes of ``PROBE_TEXT``), one greedy
token each from the engine, with its logprob; the trainer's full ``log_softmax`` at the same
contexts from one forward pass (``read_model``). The old reading is the trainer's full
distributions kept from the previous check of this engine (``policy._weight_probe``; it was taken
when the engine was confirmed to serve those weights, and is valid while the engine's
``weights_version`` has not moved since), so any token the engine picks has an old logprob.

The verdict (``judge``), with ``E`` the engine's logprobs, ``N`` and ``O`` the trainer's new and
old ones of the same tokens, all distances the largest over the contexts:

- ``dist_new = |E - N|`` over the absolute ``tolerance`` (by the trained model's dtype: float32
  2e-3, half precision 0.15) fails: the engine serves neither.
- ``change = |N - O|`` is what the push should have moved; ``noise`` is the engine's own
  disagreement with the trainer at matching weights: twice ``dist_new`` of the last *verified*
  check (a pass, or the first reading of the engine), at least ``FLOOR`` of the dtype; never
  taken from an indistinct check, where the distance may be staleness (a stale engine's
  distance grows with every dropped push: read as noise, it would hide the next one).
  ``change < SEPARATION * noise``: **indistinct** -- the update is too small to see through
  this engine's noise; the push is kept, counted (``probe_indistinct``; ``probe_unverified``
  in a row) and said (``probe_reason``), never called a pass. So is the first push into an
  engine (no old reading yet).
- after indistinct checks, a check too small to see on its own is judged against the trainer's
  reading ``V`` at the last verified version instead: with ``cumulative = |N - V|`` (the
  updates since, added up) at least ``SEPARATION * noise``, it passes when ``dist_V - dist_new
  >= cumulative / 2`` (the same margin as below) and fails otherwise, so a run of small dropped
  pushes fails as soon as together they move the probe beyond the engine's noise.
- otherwise **pass** when the engine is closer to the new weights than to the old by at least
  half the change (``dist_old - dist_new >= change / 2``), else **fail** (a stale engine sits on
  the old reading; a half-applied push in between). A fresh engine with noise ``n`` has
  ``dist_old - dist_new >= change - 2n``, so it passes while ``n <= change / 4``, which the
  separation guarantees up to twice the previous check's noise.
- first of all, whatever the noise, an engine whose reading is bit for bit its previous one
  while the trainer's moved by ``MOVE`` (float32 1e-4, half precision 1e-2) **fails**: it did
  not get the push. One step at lr 1e-6 in bfloat16 moves SmolLM2's probe by ~0.1 (which bf16
  weights round differently), about what a bfloat16 engine with other kernels differs from the
  trainer by: a dropped push is caught there even when a real one can only be indistinct.

Measured (CPU): SmolLM2 float32 hf and vLLM engines and bfloat16 hf engines, one step at lr 1e-6:
dropped push fails, real push passes; the tiny model in bfloat16 (its step moves the probe 4e-5):
indistinct either way.

A failed check puts the engine back with ``restore_previous(policy)`` and raises
``WeightSyncError``. Every engine a push goes to can do that, or ``check_before_push`` refuses the
push before anything is sent: ``restore_weights`` (vLLM, ``openai:`` servers that can restore),
or, for a policy holding an ``nn.Module`` (``hf``, ``tiny``), a CPU copy of its weights taken
before the push (``keep_undo``), released when the check passes. Under FSDP the trainer's model
is probed inside ``trainer.gathered_for_generation()`` (the self-play loop pushes there); outside
it the push is refused up front.

Greedy logprobs are ``log_softmax(logits)`` in every backend, so the probe needs no temperature.
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
    """The verdict on one reading (module docstring): ``tokens``/``engine`` from
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


# -- before the push ------------------------------------------------------------------------------

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


def check_before_push(policy: Any, verify: Any) -> Any:
    """The model to check ``policy`` against after the push (None: no check), refusing with
    ``WeightSyncError`` before anything is sent when the push could not be checked or a failed
    check could not be undone. Takes the undo copy of a module policy (``keep_undo``)."""
    if verify is None or verify is False or "logprobs" not in getattr(policy, "capabilities", ()):
        return None
    model = reference_model(verify)
    if model is None:
        return None
    why = cannot_restore(policy)
    if why:
        name = getattr(policy, "name", type(policy).__name__)
        raise WeightSyncError(f"{name}: refusing the push: {why}, so a push that fails its "
                              "check could not be undone (push_weights(..., verify=False) "
                              "pushes unchecked; nothing was pushed)")
    keep_undo(policy)
    return model


def cannot_restore(policy: Any) -> str | None:
    """Why ``restore_previous`` could not put ``policy`` back after a push (None: it can)."""
    ask = getattr(policy, "cannot_restore_weights", None)
    if callable(ask):
        return ask()
    engine = getattr(policy, "weights", None)  # VLLMPolicy: its EngineWeights
    ask = getattr(engine, "cannot_restore", None)
    if callable(ask) and ask():
        return ask()
    if callable(getattr(policy, "restore_weights", None)):
        return None
    if _module(policy) is not None:
        return None
    return f"{type(policy).__name__} has no restore_weights"


def _module(policy: Any) -> Any:
    import torch

    model = getattr(policy, "model", None)
    return model if isinstance(model, torch.nn.Module) and callable(
        getattr(policy, "load_weights", None)) else None


def keep_undo(policy: Any) -> None:
    """For a module policy without ``restore_weights``: a CPU copy of its weights (tied aliases
    once), what ``restore_previous`` puts back; kept until ``confirm``."""
    model = _module(policy)
    if model is None or callable(getattr(policy, "restore_weights", None)):
        return
    seen: dict[tuple[int, tuple[int, ...]], str] = {}
    copy: dict[str, Any] = {}
    for name, t in model.state_dict().items():
        key = (t.data_ptr(), tuple(t.shape))
        if key in seen and t.numel():
            continue
        seen[key] = name
        copy[name] = t.detach().to("cpu", copy=True)
    policy._weights_undo = (copy, getattr(policy, "weights_version", None))


# -- the check --------------------------------------------------------------------------------

def probe_push(policy: Any, model: Any, *, tolerance: float | None = None,
               contexts: int = PROBE_CONTEXTS) -> dict[str, Any]:
    """Check ``policy`` against ``model`` after a push (module docstring). Returns
    ``probe_max_abs_diff`` (the engine's distance from the new weights), ``probe_dist_old``,
    ``probe_change``, ``probe_noise`` (those defined), ``probe_tokens`` (contexts read),
    ``probe_indistinct`` (1 or 0), ``probe_indistinct_total`` (this engine's count so far),
    ``probe_verdict`` and ``probe_reason``; ``WeightSyncError`` (after ``restore_previous``)
    on a fail."""
    name = getattr(policy, "name", type(policy).__name__)
    dtype = str(next(model.parameters()).dtype).replace("torch.", "")
    tol = TOLERANCE.get(dtype, 0.15) if tolerance is None else float(tolerance)
    record = getattr(policy, "_weight_probe", None)  # valid: push_weights checked it before
    ctx = probe_contexts(policy.tokenizer, contexts)
    try:
        tokens, lps = read_engine(policy, ctx)
    except Exception as exc:
        restored = restore_previous(policy)
        raise WeightSyncError(f"{name}: the probe after the weight push failed "
                              f"({type(exc).__name__}: {exc}); {restored}") from exc
    new = read_model(model, ctx)
    old = noise = previous = verified = None
    unverified = 0
    if record is not None and record["contexts"] == ctx and record["old"].shape == new.shape:
        old, previous = record["old"], record["engine"]
        verified, unverified = record["verified"], record["unverified"]
        noise = max(FLOOR.get(dtype, 1e-4), 2 * record["noise"])
    result = judge(tokens, lps, new, old, noise=noise, tolerance=tol, previous=previous,
                   move=MOVE.get(dtype, 1e-2), verified=verified, unverified=unverified)
    stats = {k: v for k, v in (("probe_max_abs_diff", result["dist_new"]),
                               ("probe_dist_old", result["dist_old"]),
                               ("probe_change", result["change"]),
                               ("probe_noise", result["noise"]),
                               ("probe_dist_verified", result["dist_verified"]),
                               ("probe_cumulative_change", result["cumulative"]))
             if math.isfinite(v)}
    stats.update(probe_tokens=result["contexts"], probe_verdict=result["verdict"],
                 probe_reason=result["reason"])  # (undefined distances are left out)
    if result["verdict"] == "fail":
        restored = restore_previous(policy)
        if not restored.startswith("the previous weights were restored"):
            forget(policy)  # the engine's state is unknown now
        raise WeightSyncError(
            f"{name}: after the weight push the engine does not serve the trainer's weights: "
            f"{result['reason']}; {restored}", probe_verdict="fail",
            **{k: v for k, v in stats.items() if isinstance(v, float)})
    confirm(policy)  # what a later failed push goes back to
    count = int(getattr(policy, "_weight_probe_indistinct", 0)) + \
        (result["verdict"] == "indistinct")
    policy._weight_probe_indistinct = count
    if result["verdict"] == "pass" or old is None:  # a verified (or a first) reading
        verified, noise_seen, unverified = new, result["dist_new"], 0
    else:  # indistinct: the engine's distance now may be staleness, never noise
        noise_seen, unverified = record["noise"], unverified + 1
    policy._weight_probe = {"contexts": ctx, "old": new, "noise": noise_seen,
                            "verified": verified, "unverified": unverified,
                            "engine": (tokens, lps),
                            "after": getattr(policy, "weights_version", None)}
    stats.update(probe_indistinct=int(result["verdict"] == "indistinct"),
                 probe_indistinct_total=count, probe_unverified=unverified)
    return stats


def valid_record(policy: Any) -> None:
    """Drop the kept old reading when the engine's weights moved since it was taken (a push
    that was not checked): called before each push."""
    record = getattr(policy, "_weight_probe", None)
    if record is not None and record.get("after") != getattr(policy, "weights_version", None):
        forget(policy)


def forget(policy: Any) -> None:
    """Drop the old reading kept for ``policy`` (its weights changed unchecked)."""
    if getattr(policy, "_weight_probe", None) is not None:
        policy._weight_probe = None


def confirm(policy: Any) -> None:
    """The last push stands: what a later failed push goes back to."""
    policy_confirm = getattr(policy, "confirm_weights", None)
    if callable(policy_confirm):
        policy_confirm()
    elif getattr(policy, "_vllm_server", False):
        from spadekit.policy import vllm_server

        vllm_server.confirm(policy)
    if getattr(policy, "_weights_undo", None) is not None:
        policy._weights_undo = None


def restore_previous(policy: Any) -> str:
    """Put the engine back on the weights it had before the failed push, where it can; a
    sentence saying what happened (for the error message)."""
    undo = getattr(policy, "_weights_undo", None)
    restore = getattr(policy, "restore_weights", None)
    if not callable(restore) and getattr(policy, "_vllm_server", False):
        from spadekit.policy import vllm_server

        restore = lambda: vllm_server.restore(policy)  # noqa: E731
    if not callable(restore) and undo is not None:
        def restore() -> None:
            copy, version = undo
            policy.load_weights(list(copy.items()))
            if version is not None:
                policy.weights_version = version  # the undone push never happened
            policy._weights_undo = None
    if not callable(restore):
        return "this engine cannot restore its previous weights: treat it as broken"
    try:
        restore()
    except Exception as exc:
        return f"restoring the previous weights failed too ({type(exc).__name__}: {exc})"
    return "the previous weights were restored"
