"""Programs from files: plain directories of ``.py`` environments, and the SPADE reference
implementation's stored state (its environment memory file and its games directory).

:func:`programs_from_dir` reads every ``*.py`` file of a directory (sorted by name) that defines
a top-level ``...Env`` class; files that do not parse or define none are skipped. The skill
comes from a ``# skill: X`` header line (spadekit's pool files) or a reference game file name
(``game_<rollout>_<index>_<skill_slug>.py``), when it names a known skill.

:func:`import_reference` turns a reference run's state into spadekit's pool format (see
``spadekit.selfplay.generate``): the memory file (``env_memory.json``: a JSON list of records with
``game_file``, ``skill``, ``code_snippet``, ``actor_win_rate``, ``regret``, ``rollout_id``,
``metadata``) and/or the games directory (``game_*.py``). The full code of a memory record is
read from its ``game_file`` when that exists, else from the file of the same name in the games
directory, else from ``code_snippet`` when the snippet is a complete program (the reference cuts
snippets at ``code_snippet_max_chars``, 2000 by default, so longer ones are not). Every program
carries ``meta["lineage"]`` saying where it came from (``spade-reference``, the memory file and
record index, the game file, rollout id) and, from the memory, ``meta["reference_stats"]``
(``win_rate``, ``regret``) which memory seeding uses. Records that cannot be recovered are
listed in the returned summary, never silently dropped.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from spadekit.envs.program import EnvProgram, ProgramSyntaxError, find_env_classes
from spadekit.common.errors import ConfigError

__all__ = ["import_reference", "program_from_file", "programs_from_dir", "skill_of"]

_GAME_FILE = re.compile(r"^game_(\d+)_(\d+)_(.+)\.py$")
_SKILL_LINE = re.compile(r"^#\s*skill:\s*([A-Za-z_ -]+?)\s*(?:\s{2,}|$)", re.MULTILINE)
REFERENCE_HEADER = '"""SPADE self-play generated game"""'


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
    try:
        code = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: cannot read: {exc}") from None
    if not _env_program(code, str(path)):
        return None
    return EnvProgram(code=code, skill=skill_of(path.name, code), source=source,
                      meta={"lineage": {"file": str(path), **lineage}})


def programs_from_dir(path: str | Path) -> list[EnvProgram]:
    """The environment programs of a plain directory (see the module docstring)."""
    folder = Path(path)
    out, seen = [], set()
    for file in sorted(folder.glob("*.py")):
        program = program_from_file(file)
        if program is not None and program.sha256 not in seen:
            seen.add(program.sha256)
            out.append(program)
    return out


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value)


def _memory_records(memory: Path) -> list[dict[str, Any]]:
    try:
        data = json.loads(memory.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{memory}: cannot read the reference memory file: {exc}") from None
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{memory}: not JSON ({exc.msg} at line {exc.lineno})") from None
    if isinstance(data, dict) and isinstance(data.get("records"), list):
        data = data["records"]
    if not isinstance(data, list):
        raise ConfigError(f"{memory}: a reference memory file is a JSON list of records")
    return data


def import_reference(memory: str | Path | None = None, games: str | Path | None = None,
                     ) -> tuple[list[EnvProgram], dict[str, Any]]:
    """Programs of a reference memory file and/or games directory, and a summary
    ``{"memory_records", "game_files", "imported", "skipped": [{"what", "why"}]}``."""
    if memory is None and games is None:
        raise ConfigError("give a reference memory file, a games directory, or both")
    games_dir = Path(games) if games is not None else None
    if games_dir is not None and not games_dir.is_dir():
        raise ConfigError(f"{games_dir}: not a directory")
    programs: dict[str, EnvProgram] = {}
    skipped: list[dict[str, str]] = []
    records = _memory_records(Path(memory)) if memory is not None else []
    for index, record in enumerate(records):
        what = f"memory record {index}"
        if not isinstance(record, dict):
            skipped.append({"what": what, "why": "not a JSON object"})
            continue
        game_file = record.get("game_file") if isinstance(record.get("game_file"), str) else ""
        lineage = {"origin": "spade-reference", "memory_file": str(memory),
                   "memory_index": index, "game_file": game_file or None,
                   "rollout_id": record.get("rollout_id")}
        candidates = [Path(game_file)] if game_file else []
        if game_file and games_dir is not None:
            candidates.append(games_dir / Path(game_file).name)
        code = None
        for candidate in candidates:
            if candidate.is_file():
                try:
                    code = candidate.read_text(encoding="utf-8")
                    lineage["read_from"] = str(candidate)
                    break
                except (OSError, UnicodeDecodeError):
                    continue
        snippet = record.get("code_snippet")
        if code is None and isinstance(snippet, str) and _env_program(snippet, what):
            code, lineage["read_from"] = snippet, "code_snippet"
        if code is None or not _env_program(code, what):
            skipped.append({"what": f"{what} ({game_file or 'no game_file'})",
                            "why": "the game file is gone and the stored snippet is not a "
                                   "complete program (the reference cuts snippets)"})
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
            program = program_from_file(file, source="spade-reference",
                                        origin="spade-reference", games_dir=str(games_dir))
            if program is None:
                skipped.append({"what": str(file), "why": "defines no ...Env class or does "
                                "not parse"})
            elif program.sha256 not in programs:
                programs[program.sha256] = program
    summary = {"memory_records": len(records), "game_files": n_files,
               "imported": len(programs), "skipped": skipped}
    return list(programs.values()), summary
