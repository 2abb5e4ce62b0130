"""``TrainConfig``: every knob of the policy update (SPEC point 8), named as TRL's ``GRPOConfig``
names the same thing, with SPADE's defaults.

The trainer (``spadekit.train.trainer.PolicyTrainer``) reads only this dataclass. Differences
from TRL, where the meaning is not the same:

- One ``PolicyTrainer.train_step`` call is one batch (``num_iterations`` optimizer steps over it).
  Micro-batches come from a token budget (``max_tokens_per_microbatch``) and a row cap
  (``per_device_train_batch_size``); the number of micro-batches is what TRL calls
  ``gradient_accumulation_steps`` and is reported per step, not configured.
- ``loss_type`` takes spadekit's names: ``"token"`` (every loss token of the whole batch counts
  the same; TRL's ``"dapo"``) or ``"sequence"`` (mean per sequence, then over sequences; TRL's
  ``"grpo"``).
- Under ``accelerate launch``/``torchrun`` ``per_device_train_batch_size`` and the token budget
  are per rank; ``train_step`` takes the global batch (``split_batches``) and the update equals
  the single-process update on it (``spadekit.train.distributed``).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

from spadekit.policy.base import MIN_TEMPERATURE

LOSS_TYPES = ("token", "sequence")
DISTRIBUTED_STRATEGIES = ("auto", "no", "ddp", "fsdp", "deepspeed")
SAMPLE_GRANULARITIES = ("episode", "turn")


@dataclass
class TrainConfig:
    # -- optimizer (AdamW, constant learning rate) ------------------------------------------
    learning_rate: float = 1e-6
    """Constant AdamW learning rate (SPEC: 1e-6, no schedule)."""
    weight_decay: float = 0.1
    """Decoupled weight decay; applied to matrices only (parameters with 2 or more dims), not to
    biases and norm scales, as the Hugging Face Trainer does."""
    adam_beta1: float = 0.9
    """AdamW beta1."""
    adam_beta2: float = 0.98
    """AdamW beta2 (SPEC: 0.98)."""
    adam_epsilon: float = 1e-8
    """AdamW epsilon."""
    max_grad_norm: float | None = 1.0
    """Clip the global gradient L2 norm to this value before each optimizer step; None or 0
    disables clipping (the norm is still reported)."""

    # -- loss ---------------------------------------------------------------------------------
    epsilon: float = 0.2
    """Lower clip of the PPO ratio: ``1 - epsilon``."""
    epsilon_high: float = 0.28
    """Upper clip of the PPO ratio: ``1 + epsilon_high`` ("clip-higher")."""
    beta: float = 0.0
    """Coefficient of the k3 KL penalty to the reference policy (SPEC: 0; 0.005 for the 8B and
    tool-use runs). With ``beta > 0`` the reference is a frozen copy of the initial weights
    (full fine-tuning) or the base model with the adapter disabled (``use_peft``)."""
    loss_type: str = "token"
    """``"token"``: mean over every loss token of the whole batch (SPEC). ``"sequence"``: mean
    over each sequence's tokens, then over the sequences of the whole batch."""
    temperature: float = 1.0
    """Logits are divided by this before the log-softmax, so training logprobs are those of the
    sampling distribution. Set it to the rollout temperature (SPEC: 0.6): the PPO ratio and
    the importance weights compare logprobs at the same temperature."""
    importance_sampling_cap: float = 2.0
    """Truncated importance sampling for delayed samples: each token's surrogate is multiplied by
    ``min(pi_old / pi_behaviour, cap)`` (SPEC point 7)."""
    importance_sampling_roles: tuple[str, ...] = ("designer",)
    """Roles whose samples are off-policy and get the importance weight; a sample of these roles
    without behaviour logprobs is dropped (and counted). Add ``"agent"`` to also correct the
    agent's samples for a sampler/trainer mismatch (e.g. vLLM sampling)."""
    mask_truncated_completions: bool = False
    """Drop samples whose episode was truncated (a ``truncated`` attribute set on the sample) from
    the loss; SPEC: optional for tool use."""
    sample_granularity: str = "episode"
    """How an agent episode becomes training samples (TRL has no equivalent: it trains single
    completions). ``"episode"``: one sample, the whole multi-turn sequence with every assistant
    turn in its loss mask. ``"turn"``: one sample per assistant turn (the conversation up to the
    end of that turn, only that turn's tokens in the loss), each with the episode's advantage,
    as the SPADE reference does for thinking models (``spadekit.selfplay.advantages.per_turn_samples``).
    With ``"turn"`` an episode weighs in proportion to its turns under ``loss_type="sequence"``,
    and earlier turns' tokens are recomputed as context in later samples."""

    # -- batching -------------------------------------------------------------------------------
    per_device_train_batch_size: int = 8
    """Most sequences in one micro-batch (one forward/backward)."""
    max_tokens_per_microbatch: int = 8192
    """Token budget of one micro-batch, counted with padding (rows x longest row). A sequence
    longer than the budget gets a micro-batch of its own. Bounds memory whatever the batch."""
    num_iterations: int = 1
    """Optimizer steps per batch (PPO epochs; TRL's ``num_iterations``). With 1, the old policy
    is the current one and the PPO ratio is exactly 1 (its gradient is the plain policy
    gradient); with more, the ratio moves away from 1 after the first step and is clipped."""
    gradient_checkpointing: bool = False
    """Recompute activations in the backward pass (less memory, about a third more compute)."""
    logprob_chunk_size: int = 1024
    """Loss tokens per chunk of the LM-head projection. Logits are computed only at loss
    positions, chunk by chunk, and recomputed in the backward, so the ``[tokens, vocab]`` logits
    never exist for more than one chunk at a time."""

    # -- LoRA (peft) ----------------------------------------------------------------------------
    use_peft: bool = False
    """Train a LoRA adapter instead of all weights; the policy keeps generating with the adapter
    active (the layers are injected in the same module object)."""
    lora_r: int = 16
    """LoRA rank."""
    lora_alpha: int = 32
    """LoRA scaling numerator (the update is scaled by ``lora_alpha / lora_r``)."""
    lora_dropout: float = 0.0
    """Dropout on the LoRA branch input."""
    lora_target_modules: str | list[str] = "all-linear"
    """Modules that get an adapter: peft's ``"all-linear"`` (every linear layer but the output
    head) or a list of module names."""

    # -- multi-process (accelerate launch / torchrun; see spadekit.train.distributed) ----------
    distributed_strategy: str = "auto"
    """``"auto"`` (one process: none; under a launcher: accelerate's choice from
    ``ACCELERATE_USE_FSDP``/``ACCELERATE_USE_DEEPSPEED``, else DDP), ``"no"`` (ignore the
    launcher: each process trains alone), ``"ddp"``, ``"fsdp"`` (FSDP2 ``fully_shard``) or
    ``"deepspeed"`` (not supported: raises)."""
    split_batches: bool = True
    """accelerate's ``split_batches``: every rank passes the same GLOBAL list of samples to
    ``train_step`` and trains its deterministic share. False: each rank's list is its own share
    (the loss normaliser and the counts are all-reduced)."""
    ddp_backend: str | None = None
    """Process-group backend when the trainer initialises it (None: NCCL on CUDA, else gloo)."""
    ddp_timeout: int = 1800
    """Seconds a collective may wait before the process group gives up."""
    ddp_find_unused_parameters: bool = False
    """DDP's ``find_unused_parameters`` (only needed for models that skip trainable weights)."""
    ddp_bucket_cap_mb: int | None = None
    """DDP's gradient bucket size in MiB (None: torch's default)."""
    fsdp_reshard_after_forward: bool | None = None
    """FSDP: free the gathered weights after each forward (ZeRO-3, True) or keep them until the
    backward (ZeRO-2-like, False); None reads accelerate's ``FSDP_RESHARD_AFTER_FORWARD``, else
    True."""

    # -- reproducibility ------------------------------------------------------------------------
    seed: int = 0
    """Seeds python's and torch's generators when the trainer is built (None-like values are not
    accepted: a run must be reproducible)."""

    def __post_init__(self) -> None:
        def bad(msg: str) -> ValueError:
            return ValueError(f"TrainConfig: {msg}")

        if not (self.learning_rate >= 0 and math.isfinite(self.learning_rate)):
            raise bad(f"learning_rate must be finite and >= 0, got {self.learning_rate}")
        if self.weight_decay < 0:
            raise bad(f"weight_decay must be >= 0, got {self.weight_decay}")
        for name in ("adam_beta1", "adam_beta2"):
            if not 0 <= getattr(self, name) < 1:
                raise bad(f"{name} must be in [0, 1), got {getattr(self, name)}")
        if not self.adam_epsilon > 0:
            raise bad(f"adam_epsilon must be > 0, got {self.adam_epsilon}")
        if self.max_grad_norm is not None and self.max_grad_norm < 0:
            raise bad(f"max_grad_norm must be >= 0 or None, got {self.max_grad_norm}")
        if not 0 <= self.epsilon < 1 or self.epsilon_high < 0:
            raise bad(f"need 0 <= epsilon < 1 and epsilon_high >= 0, got {self.epsilon}, "
                      f"{self.epsilon_high}")
        if self.beta < 0:
            raise bad(f"beta must be >= 0, got {self.beta}")
        if self.loss_type not in LOSS_TYPES:
            raise bad(f"loss_type must be one of {LOSS_TYPES}, got {self.loss_type!r}")
        if not (self.temperature >= MIN_TEMPERATURE and math.isfinite(self.temperature)):
            raise bad(f"temperature must be finite and >= {MIN_TEMPERATURE:g} (logits divided by "
                      f"a smaller one overflow), got {self.temperature}")
        if self.sample_granularity not in SAMPLE_GRANULARITIES:
            raise bad(f"sample_granularity must be one of {SAMPLE_GRANULARITIES}, got "
                      f"{self.sample_granularity!r}")
        if not self.importance_sampling_cap > 0:
            raise bad(f"importance_sampling_cap must be > 0, got {self.importance_sampling_cap}")
        if isinstance(self.importance_sampling_roles, str):
            self.importance_sampling_roles = (self.importance_sampling_roles,)
        self.importance_sampling_roles = tuple(self.importance_sampling_roles)
        for name in ("per_device_train_batch_size", "max_tokens_per_microbatch",
                     "num_iterations", "logprob_chunk_size", "lora_r"):
            if int(getattr(self, name)) < 1:
                raise bad(f"{name} must be >= 1, got {getattr(self, name)}")
        if not 0 <= self.lora_dropout < 1:
            raise bad(f"lora_dropout must be in [0, 1), got {self.lora_dropout}")
        if self.distributed_strategy not in DISTRIBUTED_STRATEGIES:
            raise bad(f"distributed_strategy must be one of {DISTRIBUTED_STRATEGIES}, got "
                      f"{self.distributed_strategy!r}")
        if int(self.ddp_timeout) < 1:
            raise bad(f"ddp_timeout must be >= 1, got {self.ddp_timeout}")
        if not isinstance(self.seed, int):
            raise bad(f"seed must be an int, got {self.seed!r}")

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready fields (tuples become lists)."""
        out = dataclasses.asdict(self)
        out["importance_sampling_roles"] = list(self.importance_sampling_roles)
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "TrainConfig":
        """Inverse of ``to_dict``; unknown keys are an error (a typo must not pass silently)."""
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - names)
        if unknown:
            raise ValueError(f"TrainConfig: unknown fields {unknown}")
        return cls(**data)


__all__ = ["TrainConfig", "LOSS_TYPES", "DISTRIBUTED_STRATEGIES", "SAMPLE_GRANULARITIES"]
