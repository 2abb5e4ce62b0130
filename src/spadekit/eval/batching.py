"""Generation calls of an in-process model bounded by their padded attention.

A left-padded batch costs memory in ``rows x longest prompt²``, and evaluation prompts vary from
tens to thousands of tokens. :class:`CellBoundedPolicy` (``--max-batch-cells``; 0: none) splits
each ``generate`` call into sub-calls of similar prompt length, each within ``max_cells`` (one
request always fits), and returns the generations in request order; a request carries its own
seed, so splitting does not change what is sampled. Policies that manage their own memory (vLLM,
an OpenAI-compatible server) are used as they are (:func:`bounded`). Measurements:
docs/design/eval.md.
"""

from __future__ import annotations

from typing import Any

from spadekit.common.packing import DEFAULT_BATCH_CELLS, plan_batches

__all__ = ["DEFAULT_BATCH_CELLS", "CellBoundedPolicy", "bounded", "plan_batches"]

class CellBoundedPolicy:
    """``policy`` with every ``generate`` call split by :func:`plan_batches`; everything else
    (tokenizer, name, capabilities, model) is the wrapped policy's."""

    def __init__(self, policy: Any, max_cells: int) -> None:
        self.policy = policy
        self.max_cells = int(max_cells)
        self.calls: list[tuple[int, int]] = []
        """``(rows, longest prompt)`` of every sub-call made, in order."""

    def __getattr__(self, name: str) -> Any:
        return getattr(self.policy, name)

    def generate(self, requests: list[Any]) -> list[Any]:
        widths = [len(r.prompt_ids) if r.prompt_ids is not None else 0 for r in requests]
        rows = getattr(self.policy, "max_batch_size", None) or max(1, len(requests))
        out: list[Any] = [None] * len(requests)
        for call in plan_batches(widths, rows, self.max_cells):
            self.calls.append((len(call), max(widths[i] for i in call)))
            for i, gen in zip(call, self.policy.generate([requests[i] for i in call],
                                                         max_batch_cells=0)):
                out[i] = gen
        return out


def bounded(policy: Any, max_cells: int | None) -> Any:
    """``policy`` wrapped in :class:`CellBoundedPolicy` when it pads batches in-process (an
    ``HFPolicy``): bounded by ``max_cells``, or by nothing when it is None or 0; any other
    policy itself."""
    from spadekit.policy.hf import HFPolicy

    return CellBoundedPolicy(policy, max_cells or 0) if isinstance(policy, HFPolicy) else policy
