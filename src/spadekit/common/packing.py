"""Greedy grouping of padded rows under a budget: the one planner behind the trainer's
micro-batches (``train.trainer.pack_microbatches``: rows x longest <= a token budget) and
the generation calls of an in-process model (:func:`plan_batches`: rows x longest prompt² <= a
cell budget; ``policy.hf.HFPolicy.generate`` and ``eval.batching``)."""

from __future__ import annotations

from typing import Callable, Sequence


def pack_in_order(order: Sequence[int], widths: Sequence[int], max_rows: int,
                  fits: Callable[[int, int], bool]) -> list[list[int]]:
    """Consecutive groups of the indices in ``order``: a group is closed before the index that
    would give it more than ``max_rows`` rows or make ``fits(rows, widest width)`` false; an
    index that fits nowhere gets a group of its own."""
    groups: list[list[int]] = []
    current: list[int] = []
    widest = 0
    for i in order:
        width = max(widest, widths[i])
        if current and (len(current) >= max_rows or not fits(len(current) + 1, width)):
            groups.append(current)
            current, width = [], widths[i]
        current.append(i)
        widest = width
    if current:
        groups.append(current)
    return groups


DEFAULT_BATCH_CELLS = 2 ** 27
"""Keeps one generation call's padded attention near 1 GB for ``tiny`` and 4 GB for
SmolLM2-135M (measured on a CPU: about 6 bytes a cell for ``tiny``, 25 to 30 for SmolLM2-135M)."""


def plan_batches(widths: list[int], batch_size: int, max_cells: int | None
                 ) -> list[list[int]]:
    """Indices into ``widths`` (prompt lengths in tokens) grouped into calls: shortest first
    (equal widths keep their order), at most ``batch_size`` a call, and ``len(call) x
    max(width)²`` at most ``max_cells`` unless the call holds one request. ``max_cells`` None or
    0: no cell bound."""
    order = sorted(range(len(widths)), key=lambda i: widths[i])
    return pack_in_order(order, widths, max(1, int(batch_size)),
                         lambda rows, widest: not max_cells or rows * widest ** 2 <= max_cells)


def within_cells(widths: list[int], batch_size: int, max_cells: int | None
                 ) -> list[list[int]]:
    """The calls for ``widths`` in their own order (consecutive chunks of ``batch_size``) when
    every chunk holds the cell bound, else :func:`plan_batches`'s: a batch that fits is
    generated exactly as it always was, and only one that would not is regrouped."""
    size = max(1, int(batch_size))
    chunks = [list(range(i, min(i + size, len(widths)))) for i in range(0, len(widths), size)]
    if not max_cells or all(len(c) == 1 or len(c) * max(widths[i] for i in c) ** 2 <= max_cells
                            for c in chunks):
        return chunks
    return plan_batches(widths, size, max_cells)
