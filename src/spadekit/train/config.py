"""``TrainConfig``: every knob of the policy update (SPEC point 8), named as TRL's ``GRPOConfig``
names it, with SPADE's defaults.

Where the meaning differs from TRL: one ``PolicyTrainer.train_step`` call is one batch
(``num_iterations`` optimizer steps over it), micro-batched by a token budget and a row cap
(TRL's ``gradient_accumulation_steps`` is reported, not configured); ``loss_type`` is ``token``
(TRL's ``dapo``) or ``sequence`` (TRL's ``grpo``); under a launcher the batch sizes are per
rank and the update equals the single-process one (``spadekit.train.distributed``).
"""

from __future__ import annotations

import dataclasses
from typing import Annotated, Any, Literal

import pydantic
from pydantic import Field

from spadekit.common.config_fields import (  # noqa: F401  (re-exported)
    Bool, Count, Int, NonNegative, Number, PosInt, Positive, Str, Strings, Unit, config_error,
    section)
from spadekit.policy.base import MIN_TEMPERATURE


LOSS_TYPES = ("token", "sequence")
DISTRIBUTED_STRATEGIES = ("auto", "no", "ddp", "fsdp", "deepspeed")
SAMPLE_GRANULARITIES = ("episode", "turn")
Beta = Annotated[pydantic.StrictFloat, Field(ge=0, lt=1)]
"""A number in [0, 1)."""
Temperature = Annotated[pydantic.StrictFloat, Field(ge=MIN_TEMPERATURE, allow_inf_nan=False)]
"""Logits are divided by it: at least ``MIN_TEMPERATURE`` (a smaller one overflows)."""


@section(frozen=False)
class TrainConfig:
    # -- optimizer (AdamW, constant learning rate) ------------------------------------------
    learning_rate: NonNegative = 1e-6
    """Constant AdamW learning rate (SPEC: 1e-6, no schedule)."""
    weight_decay: NonNegative = 0.1
    """Decoupled weight decay; applied to matrices only (parameters with 2 or more dims), not to
    biases and norm scales, as the Hugging Face Trainer does."""
    adam_beta1: Beta = 0.9
    """AdamW beta1."""
    adam_beta2: Beta = 0.98
    """AdamW beta2 (SPEC: 0.98)."""
    adam_epsilon: Positive = 1e-8
    """AdamW epsilon."""
    max_grad_norm: NonNegative | None = 1.0
    """Clip the global gradient L2 norm to this value before each optimizer step; None or 0
    disables clipping (the norm is still reported)."""

    # -- loss ---------------------------------------------------------------------------------
    epsilon: Beta = 0.2
    """Lower clip of the PPO ratio: ``1 - epsilon``."""
    epsilon_high: NonNegative = 0.28
    """Upper clip of the PPO ratio: ``1 + epsilon_high`` ("clip-higher")."""
    beta: NonNegative = 0.0
    """Coefficient of the k3 KL penalty to the reference policy (SPEC: 0; 0.005 for the 8B and
    tool-use runs). With ``beta > 0`` the reference is a frozen copy of the initial weights
    (full fine-tuning) or the base model with the adapter disabled (``use_peft``)."""
    loss_type: Literal[LOSS_TYPES] = "token"
    """``"token"``: mean over every loss token of the whole batch (SPEC). ``"sequence"``: mean
    over each sequence's tokens, then over the sequences of the whole batch."""
    temperature: Temperature = 1.0
    """Logits are divided by this before the log-softmax, so training logprobs are those of the
    sampling distribution. Set it to the rollout temperature (SPEC: 0.6): the PPO ratio and
    the importance weights compare logprobs at the same temperature."""
    importance_sampling_cap: Positive = 2.0
    """Truncated importance sampling for delayed samples: each token's surrogate is multiplied by
    ``min(pi_old / pi_behaviour, cap)`` (SPEC point 7)."""
    importance_sampling_roles: Strings = ("designer",)
    """Roles whose samples are off-policy and get the importance weight; a sample of these roles
    without behaviour logprobs is dropped (and counted). Add ``"agent"`` to also correct the
    agent's samples for a sampler/trainer mismatch (e.g. vLLM sampling)."""
    mask_truncated_completions: Bool = False
    """Drop samples whose episode was truncated (a ``truncated`` attribute set on the sample) from
    the loss; SPEC: optional for tool use."""
    sample_granularity: Literal[SAMPLE_GRANULARITIES] = "episode"
    """How an agent episode becomes training samples (TRL has no equivalent: it trains single
    completions). ``"episode"``: one sample, the whole multi-turn sequence with every assistant
    turn in its loss mask. ``"turn"``: one sample per assistant turn (the conversation up to the
    end of that turn, only that turn's tokens in the loss), each with the episode's advantage,
    as the SPADE reference does for thinking models (``spadekit.selfplay.advantages.per_turn_samples``).
    With ``"turn"`` an episode weighs in proportion to its turns under ``loss_type="sequence"``,
    and earlier turns' tokens are recomputed as context in later samples."""

    # -- batching -------------------------------------------------------------------------------
    per_device_train_batch_size: PosInt = 8
    """Most sequences in one micro-batch (one forward/backward)."""
    max_tokens_per_microbatch: PosInt = 8192
    """Token budget of one micro-batch, counted with padding (rows x longest row). A sequence
    longer than the budget gets a micro-batch of its own. Bounds memory whatever the batch."""
    num_iterations: PosInt = 1
    """Optimizer steps per batch (PPO epochs; TRL's ``num_iterations``). With 1, the old policy
    is the current one and the PPO ratio is exactly 1 (its gradient is the plain policy
    gradient); with more, the ratio moves away from 1 after the first step and is clipped."""
    gradient_checkpointing: Bool = False
    """Recompute activations in the backward pass (less memory, about a third more compute)."""
    logprob_chunk_size: PosInt = 1024
    """Loss tokens per chunk of the LM-head projection. Logits are computed only at loss
    positions, chunk by chunk, and recomputed in the backward, so the ``[tokens, vocab]`` logits
    never exist for more than one chunk at a time."""

    # -- LoRA (peft) ----------------------------------------------------------------------------
    use_peft: Bool = False
    """Train a LoRA adapter instead of all weights; the policy keeps generating with the adapter
    active (the layers are injected in the same module object)."""
    lora_r: PosInt = 16
    """LoRA rank."""
    lora_alpha: PosInt = 32
    """LoRA scaling numerator (the update is scaled by ``lora_alpha / lora_r``)."""
    lora_dropout: Beta = 0.0
    """Dropout on the LoRA branch input."""
    lora_target_modules: Str | list[Str] = "all-linear"
    """Modules that get an adapter: peft's ``"all-linear"`` (every linear layer but the output
    head) or a list of module names."""

    # -- multi-process (accelerate launch / torchrun; see spadekit.train.distributed) ----------
    distributed_strategy: Literal[DISTRIBUTED_STRATEGIES] = "auto"
    """``"auto"`` (one process: none; under a launcher: accelerate's choice from
    ``ACCELERATE_USE_FSDP``/``ACCELERATE_USE_DEEPSPEED``, else DDP), ``"no"`` (ignore the
    launcher: each process trains alone), ``"ddp"``, ``"fsdp"`` (FSDP2 ``fully_shard``) or
    ``"deepspeed"`` (not supported: raises)."""
    split_batches: Bool = True
    """accelerate's ``split_batches``: every rank passes the same GLOBAL list of samples to
    ``train_step`` and trains its deterministic share. False: each rank's list is its own share
    (the loss normaliser and the counts are all-reduced)."""
    ddp_backend: Str | None = None
    """Process-group backend when the trainer initialises it (None: NCCL on CUDA, else gloo)."""
    ddp_timeout: PosInt = 1800
    """Seconds a collective may wait before the process group gives up."""
    ddp_find_unused_parameters: Bool = False
    """DDP's ``find_unused_parameters`` (only needed for models that skip trainable weights)."""
    ddp_bucket_cap_mb: PosInt | None = None
    """DDP's gradient bucket size in MiB (None: torch's default)."""
    fsdp_reshard_after_forward: Bool | None = None
    """FSDP: free the gathered weights after each forward (ZeRO-3, True) or keep them until the
    backward (ZeRO-2-like, False); None reads accelerate's ``FSDP_RESHARD_AFTER_FORWARD``, else
    True."""

    # -- reproducibility ------------------------------------------------------------------------
    seed: Int = 0
    """Seeds python's and torch's generators when the trainer is built (None-like values are not
    accepted: a run must be reproducible)."""

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready fields (tuples become lists)."""
        out = dataclasses.asdict(self)
        out["importance_sampling_roles"] = list(self.importance_sampling_roles)
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "TrainConfig":
        """Inverse of ``to_dict``; unknown keys are an error (a typo must not pass silently)."""
        return cls(**data)


__all__ = ["TrainConfig", "LOSS_TYPES", "DISTRIBUTED_STRATEGIES", "SAMPLE_GRANULARITIES", "section",
           "config_error", "Str", "Bool", "Int", "PosInt", "Count", "Number", "NonNegative",
           "Positive", "Unit", "Strings"]
