"""Named fault points: where the fault-injection tests and ``benchmarks/chaos.py`` kill the process
(resume must equal an uninterrupted run).

``fault_point(name)`` does nothing unless ``SPADEKIT_FAULT`` names this point (``ROUND:PHASE``,
e.g. ``2:update`` or ``1:save:weights``; comma-separated). Then the process SIGKILLs itself: no
handler, ``finally`` or flush runs. The loop's points, in order, are :data:`ROUND_POINTS`.
Standard library only.
"""

from __future__ import annotations

import os
import signal

__all__ = ["FAULT_ENV", "ROUND_POINTS", "fault_point", "set_round"]

FAULT_ENV = "SPADEKIT_FAULT"

ROUND_POINTS = ("begin", "design", "validate", "hint", "play", "reward", "update", "sync",
                "retire", "save", "save:weights", "evaluate", "commit", "committed")
"""The fault points of one round, in the order the loop reaches them."""


_round: int | None = None


def set_round(step: int | None) -> None:
    """The round the loop is in (points reached outside the loop's own code, such as the
    checkpoint write, are named ``ROUND:point`` with it)."""
    global _round
    _round = step


def fault_point(name: str) -> None:
    """SIGKILL this process when ``SPADEKIT_FAULT`` names ``ROUND:name`` for the current round
    (or ``name`` itself); else nothing."""
    wanted = os.environ.get(FAULT_ENV)
    if not wanted:
        return
    names = wanted.split(",")
    if name in names or (_round is not None and f"{_round}:{name}" in names):
        os.kill(os.getpid(), signal.SIGKILL)
