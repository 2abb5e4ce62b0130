"""Generation calls of an in-process model bounded by their padded attention.

``HFPolicy`` left-pads a batch to its longest prompt, and when the rows differ in length the
model attends over every padded pair of positions: memory grows with ``rows x longest prompt²``
(measured on a CPU: about 6 bytes a cell for ``tiny``, 25 to 30 for SmolLM2-135M). Evaluation
prompts vary a lot: Reasoning Gym's hard items run from 20 to over 7,000 tokens of the
byte-level ``tiny`` model, and a multi-turn episode's context grows every turn. The engine sends
every live episode of a turn in one ``generate`` call, so ``spadekit eval --model tiny --suite
rg-hard --limit 2`` padded 64 items to a 7,336-token prompt and took about 16 GB.

:class:`CellBoundedPolicy` wraps such a policy for evaluation: each ``generate`` call is split
into sub-calls of similar prompt length (:func:`plan_batches`, exact widths from the requests'
token ids, on every turn), each within ``max_cells`` (one request always fits), and the
generations come back in request order. A request carries its own seed, so splitting does not
change what is sampled. Policies that manage their own memory (vLLM's paged attention, an
OpenAI-compatible server) are used as they are (:func:`bounded`).
"""

from __future__ import annotations

from typing import Any

from spadekit.common.packing import pack_in_order

DEFAULT_BATCH_CELLS = 2 ** 27
"""Keeps one call's padded attention near 1 GB for ``tiny`` and 4 GB for SmolLM2-135M."""


def plan_batches(widths: list[int], batch_size: int, max_cells: int | None
                 ) -> list[list[int]]:
    """Indices into ``widths`` (prompt lengths in tokens) grouped into calls: shortest first
    (equal widths keep their order), at most ``batch_size`` a call, and ``len(call) x
    max(width)²`` at most ``max_cells`` unless the call holds one request. ``max_cells`` None or
    0: no cell bound."""
    order = sorted(range(len(widths)), key=lambda i: widths[i])
    return pack_in_order(order, widths, max(1, int(batch_size)),
                         lambda rows, widest: not max_cells or rows * widest ** 2 <= max_cells)


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
            for i, gen in zip(call, self.policy.generate([requests[i] for i in call])):
                out[i] = gen
        return out


def bounded(policy: Any, max_cells: int | None) -> Any:
    """``policy`` wrapped in :class:`CellBoundedPolicy` when it pads batches in-process (an
    ``HFPolicy``) and ``max_cells`` is set; else ``policy`` itself."""
    if not max_cells:
        return policy
    from spadekit.policy.hf import HFPolicy

    return CellBoundedPolicy(policy, max_cells) if isinstance(policy, HFPolicy) else policy
