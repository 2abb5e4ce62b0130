"""Every step a round or the run's setup calls declares where it runs (``placed``), and the
placement mark drives the distributed wrapper."""

from __future__ import annotations

import ast
import inspect
import textwrap

import pytest

from spadekit.selfplay import pipeline
from spadekit.selfplay.distributed import EVERY, MAIN, SHARED, placed
from spadekit.selfplay.loop import SelfPlay
from spadekit.selfplay.setup import RunParts

BODIES = {SelfPlay: ("_round", "generate_round", "finish_round"),
          RunParts: ("build",)}
"""The functions that sequence steps (walked, not placed themselves)."""

PURE = {"designs_now", "_streams", "close"}
"""Calls that are the same on every rank (functions of the config and the round number)."""


def called_methods(source: str, owner: str) -> set[str]:
    """The ``owner.X(...)`` calls in ``source``."""
    tree = ast.parse(textwrap.dedent(source))
    return {node.func.attr for node in ast.walk(tree)
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
            and isinstance(node.func.value, ast.Name) and node.func.value.id == owner}


def unplaced_steps(cls: type, bodies: tuple[str, ...], extra: dict[str, str] = {}) -> set[str]:
    """The methods of ``cls`` that ``bodies`` (and the ``extra`` sources, by owner name) call
    without a placement mark."""
    calls = set()
    for name in bodies:
        calls |= called_methods(inspect.getsource(getattr(cls, name)), "self")
    for owner, source in extra.items():
        calls |= called_methods(source, owner)
    return {name for name in calls - set(bodies) - PURE
            if hasattr(cls, name) and not hasattr(getattr(cls, name), "placement")}


def test_every_step_of_a_round_and_of_the_setup_is_placed():
    async_source = inspect.getsource(pipeline.async_round)
    assert called_methods(async_source, "loop") >= {"generate_round", "finish_round"}
    assert unplaced_steps(SelfPlay, BODIES[SelfPlay], {"loop": async_source}) == set()
    assert unplaced_steps(RunParts, BODIES[RunParts]) == set()
    # and the walk sees the steps: the round's twelve, the setup's eight
    placed_calls = {n for b in BODIES[SelfPlay]
                    for n in called_methods(inspect.getsource(getattr(SelfPlay, b)), "self")
                    if hasattr(getattr(SelfPlay, n, None), "placement")}
    assert {"begin_round", "play", "update", "commit", "save_checkpoint"} <= placed_calls


def test_the_check_catches_an_unplaced_step():
    class Careless(SelfPlay):
        def finish_round(self, r, samples):
            self.update(r, samples)
            self.forget(r)  # a new step, not placed
            return self.commit(r)

        def forget(self, r):
            return None

    assert unplaced_steps(Careless, BODIES[SelfPlay]) == {"forget"}
    snippet = "def async_round(loop, r):\n    loop.play(r)\n    loop.forget(r)\n"
    assert unplaced_steps(Careless, (), {"loop": snippet}) == {"forget"}


class _Dist:
    def __init__(self, main):
        self.enabled, self.is_main, self.world_size = False, main, 1


class _Host:
    control = trainer = None

    def __init__(self, dist):
        self.dist, self.ran = dist, []

    @placed(MAIN)
    def main_step(self, x):
        self.ran.append(x)
        return x

    @placed(EVERY)
    def every_step(self, x):
        return x + 1


def test_the_mark_runs_the_step_and_refuses_an_unknown_placement():
    host = _Host(_Dist(True))
    assert host.main_step(3) == 3 and host.every_step(3) == 4 and host.ran == [3]
    assert (_Host.main_step.placement, _Host.every_step.placement) == (MAIN, EVERY)
    assert SelfPlay.advantages.placement == SHARED and SelfPlay.update.placement == EVERY
    with pytest.raises(ValueError):
        placed("anywhere")
