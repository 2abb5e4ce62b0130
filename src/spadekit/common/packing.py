"""Greedy grouping of padded rows under a budget: the one planner behind the trainer's
micro-batches (``train.trainer.pack_microbatches``: rows x longest <= a token budget) and
evaluation's generation calls (``eval.batching.plan_batches``: rows x longest² <= a cell
budget)."""

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
