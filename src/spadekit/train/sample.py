"""The training record: one ``Sample`` per sequence for the policy-gradient loss.

Made by the layers above (``spadekit.selfplay.advantages`` builds them from plays and designer
outputs; the slime adapter converts them) and consumed by ``spadekit.train.trainer``. Plain
Python, torch-free.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

__all__ = ["ROLES", "Sample"]

ROLES = ("agent", "designer")


@dataclass
class Sample:
    """One sequence for the policy-gradient loss.

    ``token_ids``: prompt and completion, all turns; ``loss_mask``: 1 on tokens the policy produced
    and is trained on; ``behaviour_logprobs``: per-token logprobs of the sampling policy, or None
    (designer samples need them for truncated importance sampling); ``advantage``: one scalar;
    ``weight``: the loss weight of every token (1.0 for the agent, ``designer_weight(...)`` for the
    designer); ``group_id``: the GRPO group; ``generated_at_step``: the producing rollout step.
    """

    role: Literal["agent", "designer"]
    group_id: str
    token_ids: list[int]
    loss_mask: list[int]
    behaviour_logprobs: list[float] | None
    advantage: float
    weight: float = 1.0
    generated_at_step: int = 0
    truncated: bool = False
    """The episode was cut off (runner cap, context, env truncation): with
    ``mask_truncated_completions`` the trainer leaves it out of the loss."""

    def __post_init__(self) -> None:
        if self.role not in ROLES:
            raise ValueError(f"Sample.role must be one of {ROLES}, got {self.role!r}")
        if len(self.loss_mask) != len(self.token_ids):
            raise ValueError(f"Sample: loss_mask has {len(self.loss_mask)} entries for "
                             f"{len(self.token_ids)} tokens")
        if any(m not in (0, 1) for m in self.loss_mask):
            raise ValueError("Sample: loss_mask entries must be 0 or 1")
        if (self.behaviour_logprobs is not None
                and len(self.behaviour_logprobs) != len(self.token_ids)):
            raise ValueError(f"Sample: behaviour_logprobs has {len(self.behaviour_logprobs)} "
                             f"entries for {len(self.token_ids)} tokens")
        if not math.isfinite(self.advantage):
            raise ValueError(f"Sample.advantage must be finite, got {self.advantage}")
        if not (math.isfinite(self.weight) and self.weight >= 0):
            raise ValueError(f"Sample.weight must be finite and >= 0, got {self.weight}")

    @property
    def num_loss_tokens(self) -> int:
        return sum(self.loss_mask)
