"""Weight sync: a separate generation engine's weights follow the trainer, checked after each push.

``WeightSync(engine).push(trainer)`` sends the trained model's full weights, Hugging Face-named,
LoRA adapters merged by peft's own ``merge_adapter`` (the trained model is bit-identical
afterwards; tied weights go once), to ``engine.load_weights`` in chunks, then checks that the
engine serves the new weights and not the old (``spadekit.policy.weight_probe``). A failed check
puts the engine back on its previous weights and raises ``WeightSyncError``; an engine that could
not be put back is refused before anything is sent. The ``WeightSync`` object owns the probe's
readings and, for engines holding an ``nn.Module`` (``hf``, ``tiny``), the undo copy. Engines
with their own undo (``vllm:``, ``openai:`` on ``vllm serve``) offer ``restore_weights``,
``confirm_weights`` and ``cannot_restore_weights``. docs/scaling.md ("Weight sync") has the rest.
"""

from __future__ import annotations

import inspect
import math
import time
from contextlib import contextmanager
from typing import Any, Iterable, Iterator, Mapping

from spadekit.common.errors import ConfigError
from spadekit.policy import weight_probe as probe
from spadekit.policy.weight_items import WeightSyncError

__all__ = ["WeightSync", "WeightSyncError", "generation_policy", "push_weights",
           "trainer_weights"]


def _module(source: Any) -> Any:
    """The ``nn.Module`` behind a trainer (its peft model), a policy, or a DDP wrapper."""
    import torch

    model = source
    while not isinstance(model, torch.nn.Module) and hasattr(model, "model"):
        model = model.model
    model = getattr(model, "module", model)
    if not isinstance(model, torch.nn.Module):
        raise WeightSyncError(f"not a model: {type(source).__name__}")
    return model


@contextmanager
def trainer_weights(source: Any) -> Iterator[list[tuple[str, Any]]]:
    """Within: ``(name, tensor)`` of the trained model under ``AutoModelForCausalLM`` names,
    adapters merged with peft's ``merge_adapter`` (live views, valid inside the block only; tied
    aliases once). On leaving, ``unmerge_adapter`` and the unmerged weights copied back exactly:
    the model is bit for bit what it was."""
    import torch

    model = _module(source)
    peft = callable(getattr(model, "merge_adapter", None)) and hasattr(model, "peft_config")
    names = [n for n, _ in model.named_parameters()]
    if not peft and any(".base_layer." in n for n in names):
        raise WeightSyncError("the model has LoRA layers but is not a peft model: pass the "
                              "trainer or its PeftModel")
    # the unmerged weights, kept in host memory (never a second copy on the accelerator)
    kept = {n: p.detach().to("cpu", copy=True) for n, p in model.named_parameters()
            if ".base_layer." in n} if peft else {}
    try:
        if peft:
            model.merge_adapter()  # inside: a merge that fails half-way is undone below
        seen: set[tuple[int, tuple[int, ...]]] = set()
        items = []
        for name, tensor in model.state_dict().items():
            out = _hf_name(name) if peft else name
            key = (tensor.data_ptr(), tuple(tensor.shape))
            if out is None or (key in seen and tensor.numel()):
                continue
            seen.add(key)
            items.append((out, tensor.detach()))
        yield items
    finally:
        if peft:
            model.unmerge_adapter()
            params = dict(model.named_parameters())
            with torch.no_grad():
                for n, t in kept.items():
                    params[n].copy_(t)


def _hf_name(name: str) -> str | None:
    """A peft state-dict name as the base model's, None for adapter-only tensors."""
    parts = name.removeprefix("base_model.model.").split(".")
    if any(p.startswith("lora_") for p in parts) or "original_module" in parts:
        return None
    if "modules_to_save" in parts:
        k = parts.index("modules_to_save")
        del parts[k:k + 2]
    return ".".join(p for p in parts if p != "base_layer")


def generation_policy(spec: str, trained: Any, *, seed: int = 0) -> Any:
    """The generation engine ``spec`` for a run training ``trained``: loaded, and checked to
    return logprobs (``ConfigError``: importance weights need them), to take weight pushes and
    to share the trained model's vocabulary (``WeightSyncError`` otherwise)."""
    from spadekit.policy.registry import load_policy

    options: dict[str, Any] = {"seed": seed}
    if spec.startswith("openai:"):  # a server sends token ids: decode them with ours
        options["tokenizer"] = trained.tokenizer
    policy = load_policy(spec, **options)
    if "logprobs" not in getattr(policy, "capabilities", ()):
        raise ConfigError(
            f"generation_model {spec!r} ({getattr(policy, 'name', type(policy).__name__)}) "
            "returns no logprobs of its sampled tokens: training needs them for the importance "
            "weights of its samples; use an engine that returns logprobs (vllm:, hf:, tiny, or "
            "a server that gives logprobs)")
    if not callable(getattr(policy, "load_weights", None)):
        raise WeightSyncError(f"generation_model {spec!r} ({type(policy).__name__}) cannot take "
                              "weight updates (no load_weights): use vllm:, hf:, tiny, or an "
                              "openai: vllm serve started as in spadekit.policy.vllm_server")
    if policy.tokenizer is None or policy.tokenizer.get_vocab() != trained.tokenizer.get_vocab():
        raise WeightSyncError(f"generation_model {spec!r} has another vocabulary than the "
                              "trained model: token ids would not mean the same")
    return policy


def push_weights(engine: Any, weights: Any, *, chunk_mb: float | None = 512,
                 **options: Any) -> dict[str, Any]:
    """One push with no earlier reading to compare with (``WeightSync(engine).push``)."""
    return WeightSync(engine, chunk_mb=chunk_mb).push(weights, **options)


class WeightSync:
    """Pushes into one generation engine, each checked against the trained model."""

    def __init__(self, engine: Any, *, chunk_mb: float | None = 512) -> None:
        self.engine, self.chunk_mb = engine, chunk_mb
        self.name = getattr(engine, "name", type(engine).__name__)
        self.record: dict[str, Any] | None = None
        """The probe's reading after the last check (the next check's old weights)."""
        self.indistinct = 0
        self._undo: tuple[dict[str, Any], Any] | None = None

    def push(self, weights: Any, *, version: int | None = None,
             verify: Any = None) -> dict[str, Any]:
        """Send ``weights`` (pairs, a mapping, or a trainer/model: ``trainer_weights``) and
        check the engine against ``verify`` (None: ``weights`` when it is a trainer or model;
        False: unchecked). Returns ``{"tensors", "loaded", "bytes", "chunks", "seconds",
        "mb_per_s"}`` and, when checked, ``verify_s`` and the ``probe_*`` fields."""
        load = getattr(self.engine, "load_weights", None)
        if not callable(load):
            raise WeightSyncError(f"{self.name} cannot load weights ({type(self.engine).__name__}"
                                  " has no load_weights): use an hf, tiny or vllm policy, or a "
                                  "vllm serve through openai:")
        if isinstance(weights, Mapping):
            weights = list(weights.items())
        elif any(hasattr(weights, a) for a in ("parameters", "train_step", "model")):
            verify = weights if verify is None else verify
            with trainer_weights(weights) as items:
                return self._push(items, version, verify)
        return self._push(weights, version, verify)

    def _push(self, items: Iterable[tuple[str, Any]], version: int | None,
              verify: Any) -> dict[str, Any]:
        if self.record is not None and self.record["after"] != self._version():
            self.record = None  # the engine moved unchecked since the last reading
        model = self._check_before(verify)
        accepts = inspect.signature(self.engine.load_weights).parameters
        stats = {"tensors": 0, "loaded": 0, "bytes": 0, "chunks": 0}
        t0 = time.perf_counter()
        limit = None if self.chunk_mb is None else max(1, int(self.chunk_mb * 2**20))
        try:
            for chunk, final in _chunks(items, limit):
                kwargs = {"final": final} if "final" in accepts else {}
                if "version" in accepts and final:
                    kwargs["version"] = version
                n = self.engine.load_weights(chunk, **kwargs)
                stats["loaded"] += int(n) if isinstance(n, int) else len(chunk)
                stats["tensors"] += len(chunk)
                stats["bytes"] += sum(_nbytes(t) for _, t in chunk)
                stats["chunks"] += 1
        except Exception as exc:
            if self._undo is None:
                raise  # nothing was applied, or the engine restored itself (vLLM)
            raise WeightSyncError(f"{self.name}: the push failed after {stats['chunks']} chunks "
                                  f"({type(exc).__name__}: {getattr(exc, 'message', exc)}); "
                                  f"{self._restore()}") from exc
        stats["seconds"] = time.perf_counter() - t0
        stats["mb_per_s"] = stats["bytes"] / 2**20 / max(stats["seconds"], 1e-9)
        if model is None:
            self.record = None  # changed unchecked: the next check has no old reading
            return stats
        t1 = time.perf_counter()
        stats.update(self._probe(model))
        stats["verify_s"] = time.perf_counter() - t1
        return stats

    def _version(self) -> Any:
        return getattr(self.engine, "weights_version", None)

    def _check_before(self, verify: Any) -> Any:
        """The model to check against (None: unchecked); refuses, before anything is sent, a
        push whose failed check could not be undone. Takes a module engine's undo copy."""
        if verify is None or verify is False or \
                "logprobs" not in getattr(self.engine, "capabilities", ()):
            return None
        model = probe.reference_model(verify)
        if model is None:
            return None
        ask = getattr(self.engine, "cannot_restore_weights", None)
        why = ask() if callable(ask) else None
        own = not callable(getattr(self.engine, "restore_weights", None))
        if own and not _is_module(getattr(self.engine, "model", None)):
            why = f"{type(self.engine).__name__} has no restore_weights"
        if why:
            raise WeightSyncError(f"{self.name}: refusing the push: {why}, so a push that fails "
                                  "its check could not be undone (verify=False pushes "
                                  "unchecked; nothing was pushed)")
        if own:
            copy, seen = {}, set()
            for name, t in self.engine.model.state_dict().items():
                key = (t.data_ptr(), tuple(t.shape))
                if key not in seen or not t.numel():
                    seen.add(key)
                    copy[name] = t.detach().to("cpu", copy=True)
            self._undo = (copy, self._version())
        return model

    def _restore(self) -> str:
        """Put the engine back on its weights before the push; a sentence saying how it went."""
        try:
            if self._undo is not None:
                copy, version = self._undo
                self._undo = None
                self.engine.load_weights(list(copy.items()), version=version)
            elif callable(getattr(self.engine, "restore_weights", None)):
                self.engine.restore_weights()
            else:
                return "this engine cannot restore its previous weights: treat it as broken"
        except Exception as exc:
            return f"restoring the previous weights failed too ({type(exc).__name__}: {exc})"
        return "the previous weights were restored"

    def _confirm(self) -> None:
        self._undo = None
        confirm = getattr(self.engine, "confirm_weights", None)
        if callable(confirm):
            confirm()

    def _probe(self, model: Any) -> dict[str, Any]:
        """The check after a push (``weight_probe``): a fail restores the engine and raises."""
        dtype = str(next(model.parameters()).dtype).replace("torch.", "")
        ctx = probe.probe_contexts(self.engine.tokenizer)
        try:
            tokens, lps = probe.read_engine(self.engine, ctx)
        except Exception as exc:
            raise WeightSyncError(f"{self.name}: the probe after the weight push failed "
                                  f"({type(exc).__name__}: {exc}); {self._restore()}") from exc
        new = probe.read_model(model, ctx)
        rec = self.record
        if rec is not None and (rec["contexts"] != ctx or rec["old"].shape != new.shape):
            rec = None
        noise = None if rec is None else max(probe.FLOOR.get(dtype, 1e-4), 2 * rec["noise"])
        result = probe.judge(tokens, lps, new, rec and rec["old"], noise=noise,
                             tolerance=probe.TOLERANCE.get(dtype, 0.15),
                             previous=rec and rec["engine"], move=probe.MOVE.get(dtype, 1e-2),
                             verified=rec and rec["verified"],
                             unverified=rec["unverified"] if rec else 0)
        stats = {f"probe_{k}": result[v] for k, v in (
            ("max_abs_diff", "dist_new"), ("dist_old", "dist_old"), ("change", "change"),
            ("noise", "noise"), ("dist_verified", "dist_verified"),
            ("cumulative_change", "cumulative")) if math.isfinite(result[v])}
        stats.update(probe_tokens=result["contexts"], probe_verdict=result["verdict"],
                     probe_reason=result["reason"])
        if result["verdict"] == "fail":
            restored = self._restore()
            self.record = None if not restored.startswith("the previous") else self.record
            raise WeightSyncError(
                f"{self.name}: after the weight push the engine does not serve the trainer's "
                f"weights: {result['reason']}; {restored}", probe_verdict="fail",
                **{k: v for k, v in stats.items() if isinstance(v, float)})
        self._confirm()
        self.indistinct += result["verdict"] == "indistinct"
        if result["verdict"] == "pass" or rec is None:  # a verified (or a first) reading
            verified, noise_seen, unverified = new, result["dist_new"], 0
        else:  # indistinct: the distance now may be staleness, never noise
            verified, noise_seen, unverified = rec["verified"], rec["noise"], \
                rec["unverified"] + 1
        self.record = {"contexts": ctx, "old": new, "noise": noise_seen, "verified": verified,
                       "unverified": unverified, "engine": (tokens, lps),
                       "after": self._version()}
        stats.update(probe_indistinct=int(result["verdict"] == "indistinct"),
                     probe_indistinct_total=self.indistinct, probe_unverified=unverified)
        return stats


def _is_module(model: Any) -> bool:
    import torch

    return isinstance(model, torch.nn.Module)


def _chunks(items: Iterable[tuple[str, Any]], limit: int | None):
    """``(chunk, is_last)`` groups of about ``limit`` bytes (one group at least)."""
    chunk: list[tuple[str, Any]] = []
    size = 0
    for name, tensor in items:
        n = _nbytes(tensor)
        if chunk and limit is not None and size + n > limit:
            yield chunk, False
            chunk, size = [], 0
        chunk.append((name, tensor))
        size += n
    yield chunk, True


def _nbytes(t: Any) -> int:
    return int(t.numel() * t.element_size()) if hasattr(t, "element_size") else 0
