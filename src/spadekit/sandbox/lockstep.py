"""Play many episodes of one program in one sandbox worker, in lockstep, as training plays them.

``play_lockstep`` takes scripted episodes (a reset seed and the actions to send), creates every
instance, resets them all, then steps each live one once per turn until each has ended, run out
of actions or reached the turn cap, exactly as a rollout turn does (``spadekit.sandbox.batch``).
Used by the validator and the tests. Every failure is a typed ``SandboxError`` raised with the
index of its episode (``LockstepError``); traces have the validator's format:
``[(reset observation,), (obs, reward, terminated, truncated), ...]``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Sequence

from spadekit.common.errors import SandboxError
from spadekit.sandbox.batch import start_many, step_many
from spadekit.sandbox.sandbox import RemoteEnv, Sandbox

__all__ = ["LockstepError", "LockstepResult", "play_lockstep"]


class LockstepError(Exception):
    """A typed sandbox failure of one lockstep episode (``index``; ``action`` if in a step)."""

    def __init__(self, error: SandboxError, index: int, action: str | None = None) -> None:
        super().__init__(error.message)
        self.error, self.index, self.action = error, index, action


@dataclass
class LockstepResult:
    traces: list[list[tuple]]
    """One trace per episode, in the order given."""
    turn_seconds: list[float] = field(default_factory=list)
    """Per lockstep turn: the seconds the worker spent on that turn's steps, all together."""
    step_seconds: list[float] = field(default_factory=list)
    """Every step's own service time, in the order served."""
    instances: list[RemoteEnv] = field(default_factory=list)
    """The instances (episode order), still live in the worker."""


def play_lockstep(sb: Sandbox, episodes: Sequence[tuple[int, Sequence[str]]], cap: int,
                  max_turns: int | None = None,
                  after_turn: Callable[[float, list[float]], None] | None = None
                  ) -> LockstepResult:
    """Create ``len(episodes)`` instances in ``sb`` (constructor ``max_turns``), reset each with
    its seed and step them in lockstep: turn ``t`` sends each live episode its ``t``-th action.
    An episode stops when the program ends it, its actions run out or after ``cap`` steps.
    ``after_turn(worker total, step times)`` runs after every turn (it may raise to stop)."""
    started = start_many([(sb, max_turns, seed, None) for seed, _actions in episodes])
    envs: list[RemoteEnv] = []
    traces: list[list[tuple]] = []
    for index, result in enumerate(started):
        if isinstance(result, SandboxError):
            raise LockstepError(result, index)
        env, obs, _info = result
        envs.append(env)
        traces.append([(obs,)])
    out = LockstepResult(traces, instances=envs)
    live = [i for i, (_seed, actions) in enumerate(episodes) if actions and cap > 0]
    turn = 0
    while live:
        pairs = [(envs[i], episodes[i][1][turn]) for i in live]
        seconds: list[float] = []
        totals: list[float] = []
        results = step_many(pairs, seconds, totals)
        out.step_seconds += seconds
        out.turn_seconds.append(max(totals) if totals else 0.0)
        if after_turn is not None:
            after_turn(out.turn_seconds[-1], seconds)
        turn += 1
        still = []
        for i, (_env, action), result in zip(live, pairs, results):
            if isinstance(result, SandboxError):
                raise LockstepError(result, i, action)
            obs, reward, term, trunc, _ = result
            traces[i].append((obs, reward, term, trunc))
            if not (term or trunc) and turn < cap and turn < len(episodes[i][1]):
                still.append(i)
        live = still
    return out
