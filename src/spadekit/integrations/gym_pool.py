"""A pool's environments as registered Gymnasium environments.

:func:`register_pool` registers every program of a source (an exported release, a pool or run
directory, anything ``spadekit.runs.sources.load_programs`` reads) as
``spadekit/<pool>-<short sha>`` (``spadekit.runs.release.gym_id``), with the sandboxed adapter
``spadekit.sandbox.gym_adapter:make`` as entry point: ``gymnasium.make(id)`` starts the program
in a sandbox worker, never in the caller's process. The hint is withheld unless
``with_hint=True``. Registering the same program again keeps the first entry; an id taken by
another program is a ``ConfigError``. :func:`check_registered` runs
Gymnasium's own ``check_env`` on each id. Details: docs/pools.md.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import gymnasium

from spadekit.common.errors import ConfigError, SpadekitError
from spadekit.runs.release import gym_id

__all__ = ["check_registered", "register_pool"]

ENTRY_POINT = "spadekit.sandbox.gym_adapter:make"


def register_pool(source: str | Path, *, name: str | None = None, with_hint: bool = False,
                  max_turns: int | None = None, **env_kwargs: Any) -> list[str]:
    """Register ``source``'s programs (see the module docstring); returns their ids in order.
    ``env_kwargs`` go to ``SandboxedTextEnv`` (``max_length``, ``on_error``, ``pool``...)."""
    from spadekit.runs.sources import load_programs

    programs = load_programs(source)
    pool_name = name or Path(str(source)).expanduser().resolve().name
    ids = []
    for program in programs:
        env_id = gym_id(pool_name, program.short_id)
        spec = gymnasium.registry.get(env_id)
        if spec is not None:
            known = spec.kwargs.get("program")
            if getattr(known, "sha256", None) != program.sha256:
                raise ConfigError(f"{env_id} is already registered for another program")
            ids.append(env_id)
            continue
        kwargs = {"program": program.with_hint(None), **env_kwargs}
        if with_hint:
            kwargs["hint"] = program.hint
        if max_turns is not None:
            kwargs["max_turns"] = max_turns
        gymnasium.register(id=env_id, entry_point=ENTRY_POINT, kwargs=kwargs,
                           max_episode_steps=None, disable_env_checker=False)
        ids.append(env_id)
    return ids


def check_registered(ids: list[str]) -> dict[str, str]:
    """Gymnasium's ``check_env`` on each registered id; ``{id: why}`` for those that fail (a
    sandbox failure counts as one)."""
    from gymnasium.utils.env_checker import check_env

    failures = {}
    for env_id in ids:
        env = None
        try:
            env = gymnasium.make(env_id)
            check_env(env.unwrapped, skip_render_check=False)
        except (AssertionError, SpadekitError, gymnasium.error.Error, TypeError,
                ValueError) as exc:
            failures[env_id] = f"{type(exc).__name__}: {exc}"[:500]
        finally:
            if env is not None:
                env.close()
    return failures
