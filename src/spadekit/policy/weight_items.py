"""The typed error of a weight sync and the ``(name, tensor)`` pairs every push carries.

Policies that take weight pushes (``hf``, ``vllm``, ``openai`` on ``vllm serve``) and the sync
itself (``spadekit.train.weight_sync``) import these from here.
"""

from __future__ import annotations

from typing import Any, Mapping

from spadekit.policy.base import PolicyError

__all__ = ["WeightSyncError", "as_items"]


class WeightSyncError(PolicyError):
    """Weights could not be synced: the policy cannot load weights, names or shapes do not
    match, the server refused the push (``status`` is its HTTP status, 0 if none)."""

    reason = "weight_sync"

    def __init__(self, message: str, status: int = 0, **details: Any) -> None:
        super().__init__(message, status=status, **details)
        self.status = status


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
