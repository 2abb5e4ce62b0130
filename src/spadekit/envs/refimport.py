"""Programs from files: plain directories of ``.py`` environments, and the SPADE reference
implementation's stored state (its ``env_memory.json`` and its games directory).

:func:`programs_from_dir` reads every ``*.py`` file (sorted) defining a top-level ``...Env`` class;
the skill comes from a ``# skill: X`` header or a reference game file name. :func:`import_reference`
turns a reference run's state into spadekit's pool format; every program carries
``meta["lineage"]`` and, from the memory, ``meta["reference_stats"]``. Records that cannot be
recovered are listed in the returned summary, never silently dropped. Everything is read as
untrusted: the memory file through ``spadekit.common.safe_json`` (non-finite numbers read as
``None`` and counted), and a game file only inside its directory; a path leading outside raises
or skips with :class:`UnsafeGameFile`. Details: docs/design/envs.md.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from spadekit.envs.program import EnvProgram, ProgramSyntaxError, find_env_classes
from spadekit.common.errors import ConfigError
from spadekit.common.safe_json import load_file

__all__ = ["MAX_GAME_FILE_BYTES", "UnsafeGameFile", "import_reference", "program_from_file",
           "programs_from_dir", "skill_of"]

MAX_GAME_FILE_BYTES = 4 * 1024 * 1024
"""The largest program file read (the sandbox runs programs of at most a million characters)."""


class UnsafeGameFile(ConfigError):
    """A reference record's ``game_file`` (or a games directory entry) that leads outside the
    games directory."""

    reason = "unsafe_game_file"


_GAME_FILE = re.compile(r"^game_(\d+)_(\d+)_(.+)\.py$")
_SKILL_LINE = re.compile(r"^#\s*skill:\s*([A-Za-z_ -]+?)\s*(?:\s{2,}|$)", re.MULTILINE)


def skill_of(name: str, code: str = "") -> str | None:
    """The known skill a file's header or reference-style name gives, or None."""
    from spadekit.envs.skills import normalize_skill

    candidates = []
    header = _SKILL_LINE.search(code[:2000])
    if header:
        candidates.append(header.group(1))
    match = _GAME_FILE.match(Path(name).name)
    if match:
        candidates.append(match.group(3))
    for text in candidates:
        for setting in ("games", "tooluse"):
            try:
                return normalize_skill(setting, text)
            except ValueError:
                continue
    return None


def _env_program(code: str, name: str) -> bool:
    try:
        return bool(find_env_classes(code, filename=name))
    except (ProgramSyntaxError, ValueError, RecursionError, MemoryError):
        return False


def program_from_file(path: Path, source: str = "file", **lineage: Any) -> EnvProgram | None:
    """The program in ``path``, or None when it defines no ``...Env`` class or does not parse."""
    code = _read_program(path)
    if code is None or not _env_program(code, str(path)):
        return None
    return EnvProgram(code=code, skill=skill_of(path.name, code), source=source,
                      meta={"lineage": {"file": str(path), **lineage}})


def _read_program(path: Path) -> str | None:
    """The text of the program file ``path``; None when it is not a regular file (a FIFO would
    block) or is larger than ``MAX_GAME_FILE_BYTES``."""
    try:
        if not path.is_file():
            return None
        with open(path, "rb") as fh:
            data = fh.read(MAX_GAME_FILE_BYTES + 1)
        if len(data) > MAX_GAME_FILE_BYTES:
            return None
        return data.decode("utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: cannot read: {exc}") from None


def programs_from_dir(path: str | Path) -> list[EnvProgram]:
    """The environment programs of a plain directory (see the module docstring);
    :class:`UnsafeGameFile` for a ``*.py`` entry that leads outside it (a symlink, resolved)."""
    folder = Path(path)
    out, seen = [], set()
    for file in sorted(folder.glob("*.py")):
        _inside(folder, file, "the directory")
        program = program_from_file(file)
        if program is not None and program.sha256 not in seen:
            seen.add(program.sha256)
            out.append(program)
    return out


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value)


def _memory_records(memory: Path) -> tuple[list[Any], int]:
    """The records of a memory file and how many non-finite numbers were read as None."""
    decoded = load_file(memory, nonfinite="null")
    data = decoded.value
    if isinstance(data, dict) and isinstance(data.get("records"), list):
        data = data["records"]
    if not isinstance(data, list):
        raise ConfigError(f"{memory}: a reference memory file is a JSON list of records")
    return data, decoded.nonfinite


def _inside(games_dir: Path, candidate: Path, what: str = "the games directory") -> Path:
    """``candidate`` with its symlinks resolved, which must lie in ``games_dir`` (else
    :class:`UnsafeGameFile`; ``what`` names the directory in the message)."""
    root = games_dir.resolve()
    try:
        resolved = candidate.resolve()
    except (OSError, RuntimeError) as exc:  # a symlink loop
        raise UnsafeGameFile(f"{candidate}: cannot be resolved ({exc})") from None
    if resolved != root and root not in resolved.parents:
        raise UnsafeGameFile(f"{candidate} leads outside {what} {games_dir} (a symlink out of "
                             "it is refused: copy the file in instead)")
    return resolved


def _game_path(games_dir: Path, game_file: str) -> Path:
    """Where a record's ``game_file`` is looked up (see the module docstring)."""
    if "\0" in game_file:
        raise UnsafeGameFile(f"{game_file!r} is not a file name")
    name = Path(game_file)
    if name.is_absolute():
        return _inside(games_dir, games_dir / name.name)
    return _inside(games_dir, games_dir / name)


def import_reference(memory: str | Path | None = None, games: str | Path | None = None,
                     ) -> tuple[list[EnvProgram], dict[str, Any]]:
    """Programs of a reference memory file and/or games directory, and a summary
    ``{"memory_records", "game_files", "imported", "nonfinite", "skipped": [{"what", "why"}]}``
    (``nonfinite``: the NaN/Infinity numbers of the memory file, read as None)."""
    if memory is None and games is None:
        raise ConfigError("give a reference memory file, a games directory, or both")
    games_dir = Path(games) if games is not None else None
    if games_dir is not None and not games_dir.is_dir():
        raise ConfigError(f"{games_dir}: not a directory")
    programs: dict[str, EnvProgram] = {}
    skipped: list[dict[str, str]] = []
    records, nonfinite = _memory_records(Path(memory)) if memory is not None else ([], 0)
    for index, record in enumerate(records):
        what = f"memory record {index}"
        if not isinstance(record, dict):
            skipped.append({"what": what, "why": "not a JSON object"})
            continue
        game_file = record.get("game_file") if isinstance(record.get("game_file"), str) else ""
        shown = game_file if len(game_file) <= 200 else game_file[:199] + "\u2026"
        lineage = {"origin": "spade-reference", "memory_file": str(memory),
                   "memory_index": index, "game_file": game_file or None,
                   "rollout_id": record.get("rollout_id")}
        code = None
        if game_file and games_dir is not None:
            try:
                candidate = _game_path(games_dir, game_file)
            except UnsafeGameFile as exc:
                skipped.append({"what": f"{what} ({shown})", "why": f"refused: {exc.message}"})
                continue
            try:
                code = _read_program(candidate)
            except ConfigError:  # unreadable or not UTF-8: the snippet may still do
                code = None
            if code is not None:
                lineage["read_from"] = str(games_dir / candidate.relative_to(
                    games_dir.resolve()))
        snippet = record.get("code_snippet")
        if code is None and isinstance(snippet, str) and _env_program(snippet, what):
            code, lineage["read_from"] = snippet, "code_snippet"
        if code is None or not _env_program(code, what):
            gone = ("the game file is gone" if games_dir is not None or not game_file else
                    "no games directory was given to read the game file from")
            skipped.append({"what": f"{what} ({shown or 'no game_file'})",
                            "why": f"{gone} and the stored snippet is not a complete program "
                                   "(the reference cuts snippets)"})
            continue
        stats = {"win_rate": _number(record.get("actor_win_rate")),
                 "regret": _number(record.get("regret"))}
        skill = record.get("skill") if isinstance(record.get("skill"), str) else ""
        program = EnvProgram(code=code, skill=skill_of(game_file, code) if not skill else
                             (skill_of(f"game_0_0_{skill}.py") or skill.replace(" ", "_")),
                             source="spade-reference",
                             meta={"lineage": lineage, "reference_stats": stats})
        programs.setdefault(program.sha256, program)
    n_files = 0
    if games_dir is not None:
        for file in sorted(games_dir.glob("*.py")):
            n_files += 1
            try:
                _inside(games_dir, file)
            except UnsafeGameFile as exc:
                skipped.append({"what": str(file), "why": f"refused: {exc.message}"})
                continue
            try:
                program = program_from_file(file, source="spade-reference",
                                            origin="spade-reference", games_dir=str(games_dir))
            except ConfigError as exc:
                skipped.append({"what": str(file), "why": exc.message})
                continue
            if program is None:
                skipped.append({"what": str(file), "why": "defines no ...Env class, does "
                                "not parse or is too large"})
            elif program.sha256 not in programs:
                programs[program.sha256] = program
    summary = {"memory_records": len(records), "game_files": n_files,
               "imported": len(programs), "nonfinite": nonfinite, "skipped": skipped}
    return list(programs.values()), summary
