"""The trained weights as Hugging Face-named tensors, and the typed error of a weight sync.

``trainer_weights`` yields the LoRA-merged, HF-named weights of a trainer or model (tied
aliases once); ``as_items`` type-checks ``(name, tensor)`` pairs; ``WeightSyncError`` is what
every push raises. The base of ``weight_sync`` (the pushes) and of the vLLM weight loaders and
the push probe, which all import from here, so none of them imports the others.
"""

from __future__ import annotations

from typing import Any, Iterator, Mapping

from spadekit.policy.base import PolicyError

__all__ = ["WeightSyncError", "as_items", "trainer_weights"]


class WeightSyncError(PolicyError):
    """Weights could not be synced: the policy cannot load weights, names or shapes do not
    match, the server refused the push (``status`` is its HTTP status, 0 if none)."""

    reason = "weight_sync"

    def __init__(self, message: str, status: int = 0, **details: Any) -> None:
        super().__init__(message, status=status, **details)
        self.status = status


def trainer_weights(trainer_or_model: Any) -> Iterator[tuple[str, Any]]:
    """The Hugging Face-named, LoRA-merged weights of the trained model (module docstring).
    Accepts a ``PolicyTrainer``, an ``HFPolicy``, a peft model or a transformers model."""
    import torch

    model = trainer_or_model
    for attr in ("model", "module"):  # PolicyTrainer/HFPolicy -> model; DDP -> module
        while not isinstance(model, torch.nn.Module) and hasattr(model, attr):
            model = getattr(model, attr)
    if not isinstance(model, torch.nn.Module):
        raise WeightSyncError(f"trainer_weights: not a model: {type(trainer_or_model).__name__}")
    if callable(getattr(model, "get_base_model", None)) and hasattr(model, "peft_config"):
        model = model.get_base_model()  # strips "base_model.model."
    modules = dict(model.named_modules())
    seen: set[tuple[int, tuple[int, ...]]] = set()
    for name, value in model.state_dict(keep_vars=True).items():
        out = _hf_name(name, modules)
        if out is None:
            continue
        hf_name, layer = out
        key = (value.data_ptr(), tuple(value.shape))
        if key in seen and value.numel():
            continue  # a tied alias
        seen.add(key)
        with torch.no_grad():
            tensor = value.detach()
            if layer is not None and name.endswith("base_layer.weight"):
                tensor = _merged(layer, tensor, hf_name)
        yield hf_name, tensor


def _hf_name(name: str, modules: dict[str, Any]) -> tuple[str, Any] | None:
    """(Hugging Face name, LoRA layer owning it or None), or None for adapter-only tensors."""
    parts = name.split(".")
    if any(p.startswith("lora_") for p in parts):
        return None
    layer = None
    out: list[str] = []
    i = 0
    while i < len(parts):
        p = parts[i]
        owner = modules.get(".".join(parts[:i]))
        if p == "base_layer":
            layer = owner
        elif p == "original_module" and _active_saved(owner) is not None:
            return None  # the trained copy in modules_to_save replaces it
        elif p == "modules_to_save":
            if i + 1 >= len(parts) or parts[i + 1] != _active_saved(owner):
                return None
            i += 1
        else:
            out.append(p)
        i += 1
    return ".".join(out), layer


def _active_saved(wrapper: Any) -> str | None:
    """The active adapter of a peft ``ModulesToSaveWrapper`` that replaces the original."""
    saved = getattr(wrapper, "modules_to_save", None)
    if saved is None or getattr(wrapper, "disable_adapters", False):
        return None
    active = getattr(wrapper, "active_adapter", None)
    active = active[0] if isinstance(active, (list, tuple)) and active else active
    return active if isinstance(active, str) and active in saved else None


def _merged(layer: Any, weight: Any, name: str) -> Any:
    import torch

    if getattr(layer, "disable_adapters", False):
        return weight
    merged_already = set(getattr(layer, "merged_adapters", []) or [])
    adapters = [a for a in getattr(layer, "active_adapters", []) or []
                if a not in merged_already and (a in getattr(layer, "lora_A", {})
                                                or a in getattr(layer, "lora_embedding_A", {}))]
    if not adapters:
        return weight
    if any((getattr(layer, "use_dora", {}) or {}).get(a) for a in adapters):
        raise WeightSyncError(f"{name}: DoRA adapters cannot be merged here; merge them with "
                              "peft (merge_and_unload on a copy) and push that model")
    total = weight.to(torch.float32).clone()
    for a in adapters:
        total += layer.get_delta_weight(a).detach().to(torch.float32)
    return total.to(weight.dtype)


def as_items(weights: Any) -> list[tuple[str, Any]]:
    """``(name, tensor)`` pairs of a mapping or an iterable, type-checked."""
    import torch

    items = list(weights.items()) if isinstance(weights, Mapping) else list(weights)
    for item in items:
        if not (isinstance(item, tuple) and len(item) == 2 and isinstance(item[0], str)
                and isinstance(item[1], torch.Tensor)):
            raise WeightSyncError(f"weights must be (name, torch.Tensor) pairs, got "
                                  f"{type(item).__name__}")
    return items
