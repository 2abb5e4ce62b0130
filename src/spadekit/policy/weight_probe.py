"""The check after every weight push: does the engine now serve the trainer's weights?

A push can "succeed" and change nothing (a CPU vLLM whose ``param.data`` was written, a server
that reloaded the wrong directory, a stale prefix cache). ``probe_push`` asks the engine for a
short greedy continuation of a fixed probe prompt, with logprobs, and scores the same tokens with
one fresh forward pass of the trained model (``spadekit.policy.hf.sequence_logprobs``, the
trainer's computation). The push stands when the largest difference is within ``tolerance``
(default by the trained model's dtype: float32 2e-3, half precision 0.15; SmolLM2-135M fp32
under vLLM measured 1.4e-5). Otherwise the engine is put back with
``restore_previous(policy)`` where the engine can do it, and ``WeightSyncError`` says so.

Greedy logprobs are ``log_softmax(logits)`` in every backend, so the probe needs no temperature.
"""

from __future__ import annotations

from typing import Any

from spadekit.policy.base import GenerationRequest, SamplingParams, encode_text
from spadekit.policy.weight_items import WeightSyncError

PROBE_TEXT = "The quick brown fox jumps over the lazy dog. Counting on: one, two, three,"
PROBE_TOKENS = 8
TOLERANCE = {"float32": 2e-3, "float64": 2e-3, "bfloat16": 0.15, "float16": 0.15}


def reference_model(source: Any) -> Any:
    """The trained ``nn.Module`` to score the probe with (a ``PolicyTrainer``, an ``HFPolicy``
    or a model), or None when it cannot be run alone here (FSDP shards, no module)."""
    import torch

    dist = getattr(source, "dist", None)
    if getattr(dist, "enabled", False) and getattr(dist, "strategy", "") == "fsdp":
        return None
    if isinstance(source, torch.nn.Module):
        model = source
    else:  # a trainer (its policy's model runs the adapters) or a policy
        model = getattr(getattr(source, "policy", None), "model", None)
        if model is None:
            model = getattr(source, "model", None)
    model = getattr(model, "module", model)  # DDP
    return model if isinstance(model, torch.nn.Module) else None


def probe_push(policy: Any, model: Any, *, tolerance: float | None = None,
               tokens: int = PROBE_TOKENS) -> dict[str, Any]:
    """``{"probe_max_abs_diff", "probe_tokens"}`` for ``policy`` against ``model``;
    ``WeightSyncError`` (after ``restore_previous``) when they disagree or the probe fails."""
    from spadekit.policy.hf import sequence_logprobs

    name = getattr(policy, "name", type(policy).__name__)
    dtype = str(next(model.parameters()).dtype).replace("torch.", "")
    tol = TOLERANCE.get(dtype, 0.15) if tolerance is None else float(tolerance)
    prompt = encode_text(policy.tokenizer, PROBE_TEXT)
    try:
        gen = policy.generate([GenerationRequest(prompt_ids=prompt, params=SamplingParams(
            temperature=0.0, max_new_tokens=tokens))])[0]
    except Exception as exc:
        restored = restore_previous(policy)
        raise WeightSyncError(f"{name}: the probe after the weight push failed "
                              f"({type(exc).__name__}: {exc}); {restored}") from exc
    if not gen.token_ids or gen.logprobs is None:
        raise WeightSyncError(f"{name}: the probe after the weight push returned no "
                              "tokens or no logprobs")
    was_training = model.training
    model.eval()
    try:
        ref = sequence_logprobs(model, list(prompt), list(gen.token_ids), 1.0)
    finally:
        model.train(was_training)
    diff = max(abs(a - b) for a, b in zip(ref, gen.logprobs))
    if not diff <= tol:  # NaN fails too
        restored = restore_previous(policy)
        raise WeightSyncError(
            f"{name}: after the weight push the engine does not serve the trainer's weights: "
            f"probe logprobs differ by up to {diff:.3g} (tolerance {tol:g}); {restored}",
            probe_max_abs_diff=diff)
    confirm = getattr(policy, "confirm_weights", None)
    if callable(confirm):
        confirm()  # what a later failed push goes back to
    elif getattr(policy, "_vllm_server", False):
        from spadekit.policy import vllm_server

        vllm_server.confirm(policy)
    return {"probe_max_abs_diff": diff, "probe_tokens": len(gen.token_ids)}


def restore_previous(policy: Any) -> str:
    """Put the engine back on the weights it had before the failed push, where it can; a
    sentence saying what happened (for the error message)."""
    restore = getattr(policy, "restore_weights", None)
    if not callable(restore) and getattr(policy, "_vllm_server", False):
        from spadekit.policy import vllm_server

        restore = lambda: vllm_server.restore(policy)  # noqa: E731
    if not callable(restore):
        return "this engine cannot restore its previous weights: treat it as broken"
    try:
        restore()
    except Exception as exc:
        return f"restoring the previous weights failed too ({type(exc).__name__}: {exc})"
    return "the previous weights were restored"
