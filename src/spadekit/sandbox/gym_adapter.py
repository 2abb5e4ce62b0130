"""Any environment program as a ``gymnasium.Env``, run inside the sandbox.

:class:`SandboxedTextEnv` hosts one program in one sandbox worker behind the standard Gymnasium
API (``reset(seed=...)``, the 5-tuple ``step``, ``render_mode="ansi"``, ``close``). Guarantees:
observations always lie in ``observation_space`` (a ``Text`` space over :data:`CHARSET`; other
characters are fitted, the exact text kept in ``info["raw_observation"]``); any ``str`` action
is forwarded unchanged; ``reset()`` without a seed is reproducible from ``np_random``; a
``max_turns`` cap truncates with ``info["turn_limit"]``; sandbox failures are re-raised typed
(``on_error="truncate"``: a truncated transition with ``info["error"]``); ``close`` is
idempotent. Importing registers nothing; :func:`make` is an entry point for
``gymnasium.register``. Design choices and an example: docs/design/sandbox.md.
"""

from __future__ import annotations

import string
import unicodedata
import weakref
from typing import Any

import gymnasium
from gymnasium import spaces
from gymnasium.error import ResetNeeded

from spadekit.envs.program import EnvProgram
from spadekit.common.errors import ConfigError, InvalidResult, SandboxClosed, SandboxError
from spadekit.sandbox import RemoteEnv, Sandbox, SandboxPool

__all__ = ["CHARSET", "SandboxedTextEnv", "fit_to_charset", "make"]

#: The default character set of both spaces: printable ASCII, whitespace included.
CHARSET: str = string.printable

_PLACEHOLDER = "?"
_CHARSET_SET = frozenset(CHARSET)

# Typography that NFKD leaves alone, spelled in ASCII.
_ASCII_SPELLING = {
    "\u2018": "'", "\u2019": "'", "\u201a": "'", "\u201b": "'", "\u2032": "'",
    "\u201c": '"', "\u201d": '"', "\u201e": '"', "\u201f": '"', "\u2033": '"',
    "\u00ab": "<<", "\u00bb": ">>", "\u2039": "<", "\u203a": ">",
    "\u2010": "-", "\u2011": "-", "\u2012": "-", "\u2013": "-", "\u2014": "--", "\u2015": "--",
    "\u2212": "-", "\u2044": "/", "\u2215": "/", "\u2022": "*", "\u00b7": ".", "\u2026": "...",
    "\u2190": "<-", "\u2192": "->", "\u2194": "<->", "\u21d0": "<=", "\u21d2": "=>",
    "\u2191": "^", "\u2193": "v",
    "\u00d7": "x", "\u00f7": "/", "\u2264": "<=", "\u2265": ">=", "\u2260": "!=",
    "\u00b1": "+/-", "\u2248": "~=",
    "\u00a0": " ", "\u2009": " ", "\u200a": " ", "\u202f": " ", "\u3000": " ",
    "\u200b": "", "\u200c": "", "\u200d": "", "\u2060": "", "\ufeff": "",
    "\u2028": "\n", "\u2029": "\n", "\u0085": "\n",
    "\u2713": "v", "\u2714": "v", "\u2717": "x", "\u2718": "x",
}
_ERROR_MODES = ("raise", "truncate")


def fit_to_charset(text: str, charset: frozenset[str] | str = CHARSET) -> str:
    """``text`` with every character outside ``charset`` replaced (docs/design/sandbox.md).

    Characters in ``charset`` are kept as they are; others are spelled in ASCII where a usual
    spelling exists, else decomposed (NFKD, combining marks dropped), else replaced by ``"?"``
    (or dropped when ``"?"`` is not in ``charset`` either). Pure ASCII text in ``CHARSET`` is
    returned unchanged (the same object).
    """
    if charset is CHARSET:
        allowed = _CHARSET_SET
    else:
        allowed = charset if isinstance(charset, frozenset) else frozenset(charset)
    if all(ch in allowed for ch in text):
        return text
    placeholder = _PLACEHOLDER if _PLACEHOLDER in allowed else ""
    out: list[str] = []
    for ch in text:
        if ch in allowed:
            out.append(ch)
            continue
        spelled = _ASCII_SPELLING.get(ch)
        if spelled is not None and all(c in allowed for c in spelled):
            out.append(spelled)
            continue
        out.append(_decomposed(ch, allowed, placeholder))
    return "".join(out)


def _decomposed(ch: str, allowed: frozenset[str], placeholder: str) -> str:
    """``ch`` by its NFKD decomposition (combining marks dropped), or ``placeholder``."""
    parts = []
    for part in unicodedata.normalize("NFKD", ch):
        if unicodedata.combining(part):
            continue
        if part == ch:
            return placeholder
        spelled = part if part in allowed else _ASCII_SPELLING.get(part)
        if spelled is None or not all(c in allowed for c in spelled):
            return placeholder
        parts.append(spelled)
    return "".join(parts) if parts else placeholder


def _release(pool: SandboxPool, sandbox: Sandbox | None, owns_pool: bool) -> None:
    """Kill the env's worker and close the pool it created (a ``weakref.finalize`` callback)."""
    try:
        if sandbox is not None:
            pool.release(sandbox)
    finally:
        if owns_pool:
            pool.close()


class SandboxedTextEnv(gymnasium.Env):
    """One environment program, hosted in one sandbox worker, as a ``gymnasium.Env[str, str]``.

    ``program``: source text or an :class:`EnvProgram` (its ``hint`` is used only if passed as
    ``hint=``). ``pool``: where the worker comes from (None: an own ``SandboxPool(warm=0)``, closed
    by :meth:`close`). ``max_turns``: passed to the program and enforced here by truncation (None:
    the program's own attribute, else no limit). ``max_length``: the length bound of actions and
    observations (``Text.max_length``); ``charset``: both spaces' characters (default
    :data:`CHARSET`, printable ASCII). ``hint``: appended as ``"\\n\\nHINT: {hint}"`` to each
    episode's first observation. ``render_mode``: None or ``"ansi"``. ``on_error``: ``"raise"``
    (default) re-raises sandbox failures from ``step``; ``"truncate"`` ends the episode with
    ``truncated=True`` and ``info["error"]``.

    Attributes: ``pool``, ``sandbox``, ``remote``, ``program_info`` (class name,
    ``has_solution``, ``has_tools``, docstring), ``max_turns`` (the enforced limit or None),
    ``turn``, ``last_seed``, ``last_observation``.
    """

    metadata = {"render_modes": ["ansi"], "render_fps": 4}

    def __init__(self, program: str | EnvProgram, *, pool: SandboxPool | None = None,
                 max_turns: int | None = None, max_length: int = 65536, hint: str | None = None,
                 render_mode: str | None = None, charset: str = CHARSET,
                 on_error: str = "raise") -> None:
        code = program.code if isinstance(program, EnvProgram) else program
        if not isinstance(code, str) or not code.strip():
            raise ConfigError("program must be a non-empty source string or an EnvProgram")
        if max_turns is not None and (isinstance(max_turns, bool) or not isinstance(max_turns, int)
                                      or max_turns < 1):
            raise ConfigError(f"max_turns must be a positive int or None, got {max_turns!r}")
        if isinstance(max_length, bool) or not isinstance(max_length, int) or max_length < 1:
            raise ConfigError(f"max_length must be a positive int, got {max_length!r}")
        if render_mode is not None and render_mode not in self.metadata["render_modes"]:
            raise ConfigError(f"render_mode must be None or one of "
                              f"{self.metadata['render_modes']}, got {render_mode!r}")
        if on_error not in _ERROR_MODES:
            raise ConfigError(f"on_error must be one of {_ERROR_MODES}, got {on_error!r}")
        if hint is not None and not isinstance(hint, str):
            raise ConfigError(f"hint must be str or None, got {type(hint).__name__}")
        if not isinstance(charset, str) or not charset:
            raise ConfigError("charset must be a non-empty string of characters")

        self.program = program if isinstance(program, EnvProgram) else None
        self.render_mode = render_mode
        self.on_error = on_error
        self.max_length = max_length
        self.charset = frozenset(charset)
        self.hint = hint
        self._hint_suffix = "" if hint is None else fit_to_charset(f"\n\nHINT: {hint}",
                                                                   self.charset)
        self.action_space = spaces.Text(max_length=max_length, min_length=0, charset=charset)
        self.observation_space = spaces.Text(max_length=max_length + len(self._hint_suffix),
                                             min_length=0, charset=charset)

        self.turn = 0
        self.last_seed: int | None = None
        self.last_observation = ""
        self._episode_open = False
        self._closed = False
        self.sandbox: Sandbox | None = None
        self.remote: RemoteEnv | None = None

        owns_pool = pool is None
        self.pool = SandboxPool(warm=0) if pool is None else pool
        try:
            self.sandbox = self.pool.acquire(code)
        except BaseException:
            if owns_pool:
                self.pool.close()
            raise
        self._finalizer = weakref.finalize(self, _release, self.pool, self.sandbox, owns_pool)
        try:
            self.remote = self.sandbox.new_env(max_turns=max_turns)
        except BaseException:
            self.close()
            raise
        self.program_info: dict = dict(self.sandbox.program or {})
        self.max_turns = max_turns if max_turns is not None else self.remote.max_turns
        if self.max_turns is not None and self.max_turns < 1:
            self.max_turns = None

    # -- Gymnasium API ---------------------------------------------------------------------

    def reset(self, *, seed: int | None = None,
              options: dict[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
        """Start an episode; the observation ends with the hint when one was given."""
        super().reset(seed=seed)
        remote = self._remote()
        if seed is None:
            seed = int(self.np_random.integers(0, 2**31))
        self._episode_open = False
        self.turn = 0
        self.last_seed = seed
        obs, info = remote.reset(seed=seed, options=options)
        obs, info = self._fit(obs, info, "reset")
        obs = obs + self._hint_suffix
        self.last_observation = obs
        self._episode_open = True
        return obs, info

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        """One turn. Sandbox failures re-raise (or truncate, with ``on_error="truncate"``)."""
        remote = self._remote()
        if not isinstance(action, str):
            raise TypeError(f"action must be str, got {type(action).__name__}")
        if not self._episode_open:
            raise ResetNeeded("call reset() before step(): no episode is running "
                              "(it has not started, has ended, or ended with an error)")
        try:
            obs, reward, terminated, truncated, info = remote.step(action)
            obs, info = self._fit(obs, info, "step")
        except SandboxError as exc:
            self._episode_open = False
            if self.on_error == "raise":
                raise
            return self.last_observation, 0.0, False, True, {"error": exc.to_dict()}
        self.turn += 1
        if (not (terminated or truncated) and self.max_turns is not None
                and self.turn >= self.max_turns):
            truncated = True
            info["turn_limit"] = True
        if terminated or truncated:
            self._episode_open = False
        self.last_observation = obs
        return obs, float(reward), bool(terminated), bool(truncated), info

    def render(self) -> str | None:
        """The last observation text with ``render_mode="ansi"``; ``None`` otherwise."""
        if self.render_mode == "ansi":
            return self.last_observation
        return None

    def close(self) -> None:
        """Kill the worker and close the pool this env created; idempotent."""
        self._closed = True
        self._episode_open = False
        finalizer = getattr(self, "_finalizer", None)
        if finalizer is not None:
            finalizer()
        super().close()

    # -- extras ----------------------------------------------------------------------------

    @property
    def closed(self) -> bool:
        return self._closed

    def solution(self) -> list[str]:
        """The program's ``solution()`` for the current episode (typed errors as for ``step``)."""
        return self._remote().solution()

    def tools(self) -> list[dict]:
        """The program's ``tools()`` schemas (tool-use environments)."""
        return self._remote().tools()

    def __repr__(self) -> str:
        name = self.program_info.get("class_name") if hasattr(self, "program_info") else None
        state = "closed" if self._closed else f"turn {self.turn}"
        return f"<SandboxedTextEnv {name or '?'} ({state})>"

    # -- internals -------------------------------------------------------------------------

    def _remote(self) -> RemoteEnv:
        if self._closed or self.remote is None:
            raise SandboxClosed("this SandboxedTextEnv was closed")
        return self.remote

    def _fit(self, obs: str, info: dict, where: str) -> tuple[str, dict]:
        fitted = fit_to_charset(obs, self.charset)
        if fitted is not obs:
            info["raw_observation"] = obs
        if len(fitted) > self.max_length:
            raise InvalidResult(f"observation has {len(fitted)} characters (max_length "
                                f"{self.max_length})", reason="observation_too_large", op=where)
        return fitted, info


def make(program: str | EnvProgram, **kwargs: Any) -> SandboxedTextEnv:
    """``SandboxedTextEnv(program, **kwargs)``, wrapped in nothing (the plain env).

    Also usable as a ``gymnasium.register`` entry point:
    ``entry_point="spadekit.sandbox.gym_adapter:make"``.
    """
    return SandboxedTextEnv(program, **kwargs)
