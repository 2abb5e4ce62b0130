"""Where untrusted environment programs run during a rollout: the ``EnvBackend`` seam.

A run opens one ``EnvSession``, which starts the episodes of untrusted programs (``start``),
steps them (``step``) and frees everything at the end (``release``). ``LocalPoolBackend`` is the
local sandbox pool (one sandbox per distinct program, batched without threads by
``spadekit.sandbox.batch``); ``spadekit.rollout.ray_envs.RayEnvBackend`` runs the same sandboxes
on Ray actors. After each ``step`` a session leaves two timings aligned with the pairs it was
given: ``step_seconds`` (each episode's own step) and ``turn_seconds`` (the total its worker
spent on the whole call, which is what a group of plays of one program costs a turn).
"""

from __future__ import annotations

import contextlib
from abc import ABC, abstractmethod
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from spadekit.common.errors import SandboxError
from spadekit.sandbox.batch import request_many, start_many, step_many
from spadekit.sandbox.pool import SandboxPool
from spadekit.sandbox.sandbox import RemoteEnv, Sandbox

__all__ = ["EnvBackend", "EnvSession", "LocalPoolBackend", "LocalPoolSession", "StartItem",
           "Started", "StepResult"]


StartItem = tuple[str, str, int | None, int]
"""What a backend starts: (program sha256, program code, max_turns for the constructor, reset
seed). Items with the same sha share one sandbox."""
Started = tuple[Any, str, dict, list[dict] | None]
"""A started episode: (handle, first observation, info, tool schemas or None)."""
StepResult = tuple[str, float, bool, bool, dict]


class EnvSession(ABC):
    """The environments of one rollout run. Every failure is a typed ``SandboxError`` in the
    result list, on that item only; ``release`` frees every sandbox the session used."""

    @abstractmethod
    def start(self, items: list[StartItem]) -> list[Started | SandboxError]:
        """Load each distinct program once (one sandbox per program), create one instance per
        item and reset it with its seed; results in item order."""

    step_seconds: list[float] | None = None
    """After ``step``: each item's own step time where the backend measures it, else None."""

    turn_seconds: list[float | None] | None = None
    """After ``step``: for each item, the total seconds its worker spent on all of this step
    call's requests (a worker serves its requests one after another, so a program that is a
    little slow per step holds every turn for ``group size`` times that); None per item or
    for the whole list where the backend does not measure it."""

    @abstractmethod
    def step(self, pairs: list[tuple[Any, str]]) -> list[StepResult | SandboxError]:
        """Step many episodes at once: (handle, action) in, checked 5-tuple out, in order."""

    @abstractmethod
    def release(self) -> None:
        """End the session: kill its sandboxes (instances die with them). Idempotent."""

    def __enter__(self) -> "EnvSession":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.release()


class EnvBackend(ABC):
    """Where untrusted environment programs run: opens one session per rollout run."""

    @abstractmethod
    def session(self) -> EnvSession:
        """A new session; use it as a context manager (``release`` on exit)."""

    def close(self) -> None:
        """Free what the backend owns (the local backend owns nothing: its pool is the
        caller's)."""


class LocalPoolBackend(EnvBackend):
    """Sandboxes from a local ``SandboxPool``, stepped with ``spadekit.sandbox.batch``.

    A session holds the pool's background boots (``SandboxPool.paused``) while it lives,
    acquires one sandbox per distinct program (``load_workers`` loads in parallel) and releases
    them all at its end. Its loading threads live as long as the session: a worker cold-started
    by a thread gets its parent-death signal when that thread ends."""

    def __init__(self, pool: SandboxPool, load_workers: int = 8) -> None:
        self.pool = pool
        self.load_workers = max(1, load_workers)

    def session(self) -> "LocalPoolSession":
        return LocalPoolSession(self.pool, self.load_workers)


class LocalPoolSession(EnvSession):
    def __init__(self, pool: SandboxPool, load_workers: int) -> None:
        self.pool = pool
        self.load_workers = load_workers
        self.sandboxes: dict[str, Sandbox] = {}
        self._ex: ThreadPoolExecutor | None = None
        self._paused: contextlib.ExitStack | None = contextlib.ExitStack()
        self._paused.enter_context(pool.paused())

    def start(self, items: list[StartItem]) -> list[Started | SandboxError]:
        codes: dict[str, str] = {}
        shas = [item[0] for item in items]
        for sha, code, _mt, _seed in items:
            codes.setdefault(sha, code)
        failed: dict[str, SandboxError] = {}
        todo = [kv for kv in codes.items() if kv[0] not in self.sandboxes]

        def acquire(item: tuple[str, str]):
            sha, code = item
            try:
                return sha, self.pool.acquire(code), None
            except SandboxError as exc:
                return sha, None, exc

        if todo:
            if self._ex is None:
                self._ex = ThreadPoolExecutor(self.load_workers)
            for sha, sb, exc in self._ex.map(acquire, todo):
                if sb is not None:
                    self.sandboxes[sha] = sb
                else:
                    failed[sha] = exc
        out: list[Any] = [failed.get(sha) for sha in shas]
        live = [i for i, sha in enumerate(shas) if sha not in failed]
        started = start_many([(self.sandboxes[shas[i]], items[i][2], items[i][3], None)
                              for i in live])
        wants_tools = [k for k, r in enumerate(started) if not isinstance(r, SandboxError)
                       and r[0].sandbox.program.get("has_tools")]
        tools_raw = request_many([(started[k][0].sandbox, "call",
                                   {"instance": started[k][0].instance, "method": "tools"})
                                  for k in wants_tools])
        tools_of: dict[int, Any] = {}
        for k, raw in zip(wants_tools, tools_raw):
            try:
                tools_of[k] = RemoteEnv.checked_tools(raw, started[k][0].sandbox) if not \
                    isinstance(raw, SandboxError) else raw
            except SandboxError as exc:
                tools_of[k] = exc
        for k, (i, result) in enumerate(zip(live, started)):
            tools = tools_of.get(k)
            if isinstance(result, SandboxError):
                out[i] = result
            elif isinstance(tools, SandboxError):
                out[i] = tools
            else:
                out[i] = (result[0], result[1], result[2], tools)
        return out

    def step(self, pairs: list[tuple[Any, str]]) -> list[StepResult | SandboxError]:
        seconds: list[float] = []
        turn: list[float] = []
        results = step_many(pairs, seconds, turn)
        self.step_seconds, self.turn_seconds = seconds, turn
        return results

    def release(self) -> None:
        try:
            for sb in self.sandboxes.values():
                self.pool.release(sb)
            self.sandboxes.clear()
        finally:
            if self._paused is not None:
                self._paused, paused = None, self._paused
                paused.close()
            if self._ex is not None:
                self._ex, ex = None, self._ex
                ex.shutdown()
