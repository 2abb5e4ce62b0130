"""Where a fixed set of environment programs comes from, read the same way by the ``envs:``
evaluation suite, ``spadekit train-fixed`` and memory seeding (``memory_seed``):

- ``library`` (or ``library:games`` / ``library:tooluse``): the hand-written reference programs;
- a directory holding ``pool.jsonl`` (or the file itself): a generated pool (``load_pool``);
- an exported release (``manifest.jsonl`` and ``games/``; ``spadekit pool export``): its
  programs whose checksums match (``spadekit.runs.release.read_release``);
- a run directory holding ``run.sqlite``: the run's designed programs that passed validation
  (pooled or retired; bootstrap copies excluded), in creation order;
- any other directory: its ``*.py`` files that define an ``...Env`` class, sorted by name
  (``spadekit.envs.refimport.programs_from_dir``; a symlink out of the directory is refused).
Programs a run took out of its pool (``blacklisted``, in a release or a pool imported from one)
are never returned. Programs are not validated here: the consumers validate.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from spadekit.envs.program import EnvProgram
from spadekit.common.errors import ConfigError

__all__ = ["load_programs"]


def load_programs(spec: str | Path, setting: str | None = None) -> list[EnvProgram]:
    """The programs named by ``spec`` (see the module docstring), optionally only those of
    ``setting`` (``games``/``tooluse``; programs without a known domain are kept). Raises
    ``ConfigError`` when the source is missing, unreadable or empty."""
    text = str(spec)
    if text == "library" or text.startswith("library:"):
        programs = _library(text.partition(":")[2] or None)
    else:
        path = Path(text).expanduser()
        from spadekit.runs.release import is_games_of_spadekit_release, is_release, read_release

        if (path / "run.sqlite").exists():
            programs = _run(path)
        elif is_release(path):
            programs = read_release(path)[0]
        elif path.is_file() or (path / "pool.jsonl").exists():
            from spadekit.runs.pool import PoolError, load_pool

            try:
                programs = load_pool(path)
            except PoolError as exc:
                raise ConfigError(str(exc)) from None
        elif path.is_dir():
            from spadekit.envs.refimport import programs_from_dir

            if is_games_of_spadekit_release(path):
                raise ConfigError(f"{text!r} is the games/ folder of an exported pool: give the "
                                  f"export itself ({path.parent}), whose manifest says which "
                                  "programs its run took out")
            programs = programs_from_dir(path)
        else:
            raise ConfigError(f"{text!r} is not an environment source: give 'library', a pool "
                              "directory (with pool.jsonl), a run directory (with run.sqlite) "
                              "or a directory of .py programs")
    programs = [p for p in programs if not _removed(p)]
    if setting is not None:
        programs = [p for p in programs if p.domain in (None, setting)]
    if not programs:
        raise ConfigError(f"{text!r} holds no environment programs"
                          + (f" for the {setting!r} setting" if setting else ""))
    return programs


def _removed(program: EnvProgram) -> bool:
    """A program its run took out of the pool (imported from a release with its removed ones)."""
    lineage = program.meta.get("lineage")
    return isinstance(lineage, Mapping) and lineage.get("status") == "blacklisted"


def _library(setting: str | None) -> list[EnvProgram]:
    from spadekit.envs import library

    if setting not in (None, "games", "tooluse"):
        raise ConfigError(f"library:{setting}: the setting must be games or tooluse")
    return [library.program(e) for e in library.list_library() if setting in (None, e.setting)]


def _run(path: Path) -> list[EnvProgram]:
    from spadekit.runs.store import RunStore
    from spadekit.runs.schema import StoreError

    try:
        store = RunStore.open(path)
    except StoreError as exc:
        raise ConfigError(f"{path}: cannot read the run database: {exc}") from None
    try:
        programs = []
        for row in store.environments():
            if row["status"] not in ("pooled", "retired"):
                continue
            if (row.get("lineage") or {}).get("bootstrap"):
                continue
            programs.append(store.get_program(row["sha256"]))
        return programs
    finally:
        store.close()
