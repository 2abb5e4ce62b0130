"""Trusted in-process environments behind the same checks as sandboxed ones.

``RolloutEngine`` steps an ``EpisodeSpec.env_factory`` environment (benchmark adapters, packaged
environments such as rlve-gym) in this process through ``LocalEnv``: whatever it raises or
returns out of contract becomes a typed ``SandboxError`` for that episode only, exactly as a
sandboxed program's would.
"""

from __future__ import annotations

import traceback
from typing import Any, Callable

from spadekit.common.errors import EnvRaised, InvalidResult, SandboxError
from spadekit.sandbox import worker as checks
from spadekit.sandbox.config import SandboxConfig
from spadekit.sandbox.sandbox import RemoteEnv

__all__ = ["LocalEnv"]


class LocalEnv:
    """An in-process environment behind the same checks as a sandboxed one: whatever it raises
    or returns out of contract becomes a typed ``SandboxError`` for that episode only."""

    max_observation_chars = SandboxConfig.max_observation_chars

    def __init__(self, factory: Callable[[], Any]):
        self.factory = factory
        self.env: Any = None

    def reset(self, seed: int) -> tuple[str, dict] | SandboxError:
        try:
            self.env = self.factory()
            value, err = checks.check_reset(self.env.reset(seed=seed), self.max_observation_chars)
            if err:
                return InvalidResult(err["message"], reason=err["reason"], op="reset")
            return value[0], value[1]
        except Exception as exc:
            return _raised(exc)

    def tools(self) -> list[dict] | None | SandboxError:
        method = getattr(self.env, "tools", None)
        if not callable(method):
            return None
        try:
            return RemoteEnv.checked_tools(method()) or None
        except Exception as exc:
            return _raised(exc)

    def step(self, action: str) -> tuple | SandboxError:
        try:
            value, err = checks.check_step(self.env.step(action), self.max_observation_chars)
            if err:
                return InvalidResult(err["message"], reason=err["reason"], op="step")
            return tuple(value[:5])
        except Exception as exc:
            return _raised(exc)


def _raised(exc: Exception) -> SandboxError:
    if isinstance(exc, SandboxError):
        return exc
    return EnvRaised(f"{type(exc).__name__}: {exc}"[:2000], exc_type=type(exc).__name__,
                     traceback="".join(traceback.format_exception(exc))[-4000:])
