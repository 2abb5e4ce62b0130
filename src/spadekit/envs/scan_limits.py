"""Bounds on the trusted parent's reading of what an untrusted program returns.

The parent reads a program's results (solution, observations, tool calls) after its worker
replied, outside every worker deadline. Every such scan is linear, capped in length and run under
a wall-clock :class:`Deadline`. Breaking a cap is ``oversized`` (:data:`OVERSIZED`), running out
of budget is ``parent_budget`` (:data:`PARENT_BUDGET`): both are
:class:`~spadekit.common.errors.InvalidResult` (the program is invalid), never ``timeout``, so
the designer's hang penalty does not apply. :class:`ParentMeter` adds up, per thread, the seconds
spent in :func:`parent_work` sections, which the validator keeps out of the program's time.
Standard library only (plus ``spadekit.common.errors``): sandbox workers import this package.
"""

from __future__ import annotations

import contextlib
import threading
import time
from typing import Iterator

from spadekit.common.errors import InvalidResult

__all__ = ["OVERSIZED", "PARENT_BUDGET", "PARENT_REASONS", "SCAN_BUDGET_S", "Deadline",
           "ParentMeter", "oversized", "parent_work"]

OVERSIZED = "oversized"
PARENT_BUDGET = "parent_budget"
PARENT_REASONS = frozenset({OVERSIZED, PARENT_BUDGET})
"""The reason codes of a program refused because the parent could not read its results."""

SCAN_BUDGET_S = 2.0
"""Wall-clock seconds one scan of one returned value may take (linear scans of capped inputs
take milliseconds; this is the backstop)."""


def oversized(message: str, **details: object) -> InvalidResult:
    """The ``InvalidResult`` of a value over a cap (reason ``oversized``)."""
    return InvalidResult(message, reason=OVERSIZED, **details)


class Deadline:
    """A scan's wall-clock budget: :meth:`check` raises ``InvalidResult(reason="parent_budget")``
    once ``budget_s`` seconds have passed since it was made."""

    __slots__ = ("what", "budget_s", "end")

    def __init__(self, what: str, budget_s: float | None = None) -> None:
        self.what = what
        self.budget_s = SCAN_BUDGET_S if budget_s is None else max(0.0, float(budget_s))
        self.end = time.monotonic() + self.budget_s

    def over(self) -> bool:
        return time.monotonic() > self.end

    def check(self) -> None:
        if time.monotonic() > self.end:
            raise self.exhausted("time")

    def exhausted(self, what: str = "work") -> InvalidResult:
        """The ``parent_budget`` error of this scan (``what``: the budget that ran out)."""
        return InvalidResult(f"{self.what}: reading it ran out of the parent's {what} budget "
                             f"({self.budget_s:g}s at most); the value is refused",
                             reason=PARENT_BUDGET)


_LOCAL = threading.local()


class ParentMeter:
    """Context manager: ``seconds`` spent in :func:`parent_work` on this thread while active
    (meters nest; each active one counts)."""

    def __init__(self) -> None:
        self.seconds = 0.0

    def __enter__(self) -> "ParentMeter":
        meters = getattr(_LOCAL, "meters", None)
        if meters is None:
            meters = _LOCAL.meters = []
        meters.append(self)
        return self

    def __exit__(self, *exc: object) -> None:
        meters = getattr(_LOCAL, "meters", [])
        if self in meters:
            meters.remove(self)


@contextlib.contextmanager
def parent_work() -> Iterator[None]:
    """Time a parent-side scan for the active :class:`ParentMeter` s of this thread (nested
    sections count once, in the outermost)."""
    depth = getattr(_LOCAL, "depth", 0)
    _LOCAL.depth = depth + 1
    start = time.perf_counter()
    try:
        yield
    finally:
        _LOCAL.depth = depth
        if depth == 0:
            spent = time.perf_counter() - start
            for meter in getattr(_LOCAL, "meters", ()):
                meter.seconds += spent
