"""A pool's environments as registered Gymnasium environments.

:func:`register_pool` registers every program of a source (an exported release, a pool or run
directory, anything ``spadekit.runs.sources.load_programs`` reads) as
``spadekit/<pool>-<short sha>`` (``spadekit.runs.release.gym_id``; ``...-hinted`` when
``with_hint=True`` shows the hint; ``<pool>`` is a release's own name), with the sandboxed adapter
``spadekit.sandbox.gym_adapter:make`` as entry point: ``gymnasium.make(id)`` starts the program
in a sandbox worker, never in the caller's process. Registering the same program with the same
settings again changes nothing; an id taken by another program or other settings is a
``ConfigError``. :func:`check_registered` runs
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


def _pool_name(source: str | Path) -> str:
    """A release's own name (its snapshot, when its checksum holds), else the source's
    directory name."""
    from spadekit.runs.release import is_release, verified_snapshot

    path = Path(str(source)).expanduser().resolve()
    if is_release(path):
        name = verified_snapshot(path).get("name")
        if isinstance(name, str) and name:
            return name
    return path.name


def _settings(kwargs: dict) -> dict:
    """What makes two registrations the same environment: the program's identity and hint
    (not its provenance meta), and every other keyword."""
    program = kwargs["program"]
    return {**{k: v for k, v in kwargs.items() if k != "program"},
            "program": (program.sha256, program.hint)}


def register_pool(source: str | Path, *, name: str | None = None, with_hint: bool = False,
                  max_turns: int | None = None, **env_kwargs: Any) -> list[str]:
    """Register ``source``'s programs (see the module docstring); returns their ids in order.
    ``env_kwargs`` go to ``SandboxedTextEnv`` (``max_length``, ``on_error``, ``charset``); they
    must be plain values, as ``gymnasium.make`` copies them (a ``pool`` cannot be passed)."""
    from spadekit.runs.sources import load_programs

    if "pool" in env_kwargs or "hint" in env_kwargs:
        raise ConfigError("register_pool takes no pool= (gymnasium.make deep-copies keyword "
                          "arguments; each environment makes its own worker) and no hint= "
                          "(use with_hint=True)")
    programs = load_programs(source)
    pool_name = name or _pool_name(source)
    ids = []
    for program in programs:
        env_id = gym_id(pool_name, program.short_id, hinted=with_hint)
        kwargs = {"program": program.with_hint(None), **env_kwargs}
        if with_hint:
            kwargs["hint"] = program.hint
        if max_turns is not None:
            kwargs["max_turns"] = max_turns
        spec = gymnasium.registry.get(env_id)
        if spec is not None:
            if _settings(spec.kwargs) != _settings(kwargs):
                known = spec.kwargs.get("program")
                what = ("another program" if getattr(known, "sha256", None) != program.sha256
                        else "other settings")
                raise ConfigError(f"{env_id} is already registered for {what}; use another "
                                  "name=")
            ids.append(env_id)
            continue
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
