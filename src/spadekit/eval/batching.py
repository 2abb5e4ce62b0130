"""Generation calls of an in-process model bounded by their padded attention.

``HFPolicy`` left-pads a batch to its longest prompt, and when the rows differ in length the
model attends over every padded pair of positions: memory grows with ``rows x longest prompt²``
(measured on a CPU: about 6 bytes a cell for ``tiny``, 25 to 30 for SmolLM2-135M). Evaluation
prompts vary a lot: Reasoning Gym's hard items run from 20 to over 7,000 tokens of the
byte-level ``tiny`` model, and a multi-turn episode's context grows every turn. The engine sends
every live episode of a turn in one ``generate`` call, so ``spadekit eval --model tiny --suite
rg-hard --limit 2`` padded 64 items to a 7,336-token prompt and took about 16 GB.

``HFPolicy.generate`` bounds every call itself (``max_batch_cells``, default
``DEFAULT_BATCH_CELLS``), so self-play's rollouts have the same bound. :class:`CellBoundedPolicy`
sets evaluation's own bound (``--max-batch-cells``; 0: none): each ``generate`` call is split into
sub-calls of similar prompt length (``plan_batches``, exact widths from the requests' token ids,
on every turn), each within ``max_cells`` (one request always fits), handed to the policy with
its own bound off, and the generations come back in request order. A request carries its own
seed, so splitting does not change what is sampled. Policies that manage their own memory
(vLLM's paged attention, an OpenAI-compatible server) are used as they are (:func:`bounded`).
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
