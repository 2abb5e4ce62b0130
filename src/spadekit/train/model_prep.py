"""How ``PolicyTrainer`` prepares the model it trains: LoRA injection, activation checkpointing,
the frozen reference copy, and the backbone/head split that lets the loss compute logits only at
loss positions (models whose logits are post-processed are not split)."""

from __future__ import annotations

import copy
import warnings
from typing import Any

from spadekit.train.config import TrainConfig

__all__ = ["LOGIT_SCALE_ATTRS", "add_lora", "enable_checkpointing", "frozen_copy", "is_peft",
           "split_head"]

# config attributes that post-process logits: a model with any of them set takes the plain forward
LOGIT_SCALE_ATTRS = ("final_logit_softcapping", "logit_scale", "output_multiplier",
                     "lm_head_multiplier", "logits_scaling")


def is_peft(model: Any) -> bool:
    """Whether ``model`` already carries a peft adapter (then it is trained as given)."""
    try:
        from peft import PeftModel
    except ImportError:
        return False
    return isinstance(model, PeftModel)


def _last_layer_linears(model: Any, layers: int, targets: Any) -> list[str]:
    """Full names of the linear (and GPT-2 ``Conv1D``) modules inside the last ``layers`` of the
    model's decoder stack (the longest ``ModuleList``), filtered by ``targets`` (leaf names)
    unless it is ``all-linear``. ``ConfigError`` when the model has no such stack."""
    import torch

    from spadekit.common.errors import ConfigError

    stacks = [(name, m) for name, m in model.named_modules()
              if isinstance(m, torch.nn.ModuleList) and len(m) > 0]
    if not stacks:
        raise ConfigError("lora_layers needs a model with a stack of decoder layers; "
                          "set lora_layers to null")
    prefix, stack = max(stacks, key=lambda item: len(item[1]))
    wanted = None if targets == "all-linear" else (
        {targets} if isinstance(targets, str) else set(targets))
    names = []
    for index in range(max(0, len(stack) - layers), len(stack)):
        for name, module in stack[index].named_modules():
            linear = isinstance(module, torch.nn.Linear) or \
                type(module).__name__ == "Conv1D"
            if linear and name and (wanted is None or name.rsplit(".", 1)[-1] in wanted):
                names.append(f"{prefix}.{index}.{name}")
    if not names:
        raise ConfigError(f"lora_layers: no linear layer in the last {layers} layers of "
                          f"{prefix} matches {targets!r}")
    return names


def add_lora(model: Any, cfg: TrainConfig) -> Any:
    """Inject LoRA layers (``lora_r``, ``lora_alpha``, ``lora_dropout``,
    ``lora_target_modules``, and ``lora_layers`` where the config has it) into ``model`` in
    place; returns the peft wrapper."""
    from peft import LoraConfig, get_peft_model

    targets, layers = cfg.lora_target_modules, getattr(cfg, "lora_layers", None)
    if layers is not None:  # the linear modules of the last ``layers`` decoder layers
        targets = _last_layer_linears(model, layers, targets)
    lora = LoraConfig(r=cfg.lora_r, lora_alpha=cfg.lora_alpha, lora_dropout=cfg.lora_dropout,
                      target_modules=targets, task_type="CAUSAL_LM")
    with warnings.catch_warnings():  # peft reads a property transformers 5.2x renamed
        warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*",
                                category=FutureWarning)
        return get_peft_model(model, lora)


def split_head(model: Any):
    """``(backbone, head)`` when the logits are exactly ``head(backbone(...).last_hidden_state)``,
    else None (then the plain forward is used)."""
    config = model.config.get_text_config() if hasattr(model.config, "get_text_config") \
        else model.config
    for attr in LOGIT_SCALE_ATTRS:
        value = getattr(config, attr, None)
        if value not in (None, 1, 1.0):
            return None
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    prefix = getattr(model, "base_model_prefix", "")
    backbone = getattr(model, prefix, None) if prefix else None
    if head is None or backbone is None or backbone is model:
        return None
    return backbone, head


def enable_checkpointing(model: Any) -> None:
    """Activation checkpointing of every decoder layer, non-reentrant (works with frozen inputs,
    as under LoRA). transformers 5.2x renamed ``gradient_checkpointing_enable``."""
    kwargs = {"use_reentrant": False}
    if hasattr(model, "activation_checkpointing_enable"):
        model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)


def frozen_copy(model: Any) -> Any:
    """A deep copy of ``model`` in eval mode with every parameter frozen (the KL reference of a
    full fine-tune)."""
    ref = copy.deepcopy(model)
    ref.eval()
    for p in ref.parameters():
        p.requires_grad_(False)
    return ref
