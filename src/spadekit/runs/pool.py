"""The environment-pool directory: the fixed-environment pool format, read and written.

``spadekit generate`` writes pools, ``import-reference`` and ``validate --out`` append to them;
fixed curricula, the memory seed and evaluation read them. A pool directory holds
``pool.jsonl`` (one valid program a line: ``EnvProgram.to_dict()`` plus ``validation`` and
``generation``), ``programs/<short_id>.py``, ``rejected.jsonl`` and ``summary.json``.

Guarantees: records are appended and flushed one at a time, a program file is written before
its pool line, summaries are replaced atomically. ``pool.jsonl`` is read as untrusted: an
unreadable line is skipped with one warning (``load_pool(..., strict=True)``: :class:`PoolError`
at the first one). Format details: docs/design/runs.md.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import hashlib
import logging
import os
from pathlib import Path
from typing import Any, Iterable

from spadekit.common.errors import ConfigError
from spadekit.common.jsonl import JsonlAppender, read_jsonl
from spadekit.common.safe_text import terminal_text
from spadekit.envs.program import EnvProgram

__all__ = ["POOL_FILE", "PROGRAMS_DIR", "PoolError", "REJECTED_FILE", "SUMMARY_FILE",
           "load_pool", "read_pool", "write_pool"]

log = logging.getLogger(__name__)

POOL_FILE, REJECTED_FILE, SUMMARY_FILE, PROGRAMS_DIR = (
    "pool.jsonl", "rejected.jsonl", "summary.json", "programs")
_EXTRA_KEYS = ("validation", "generation")


class PoolError(ConfigError):
    """A pool file that cannot be read (names the file and line); a ``ValueError`` too."""


def _now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="milliseconds")


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


def _atomic_write(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "w", encoding="utf-8") as fh:
        fh.write(text)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def _read_jsonl(path: Path, strict: bool, skipped: list[str] | None = None,
                ) -> Iterable[tuple[int, dict[str, Any]]]:
    """The JSON objects of ``path`` with their line numbers (nothing when it does not exist).
    A line that is not one raises :class:`PoolError` when ``strict``, else its reason is added
    to ``skipped`` (when given) and it is left out."""
    if not path.exists():
        return
    try:
        for line in read_jsonl(path):
            if line.error is not None:
                problem = line.error.message
            elif not isinstance(line.value, dict):
                problem = f"{path}: line {line.number}: not a JSON object"
            else:
                yield line.number, line.value
                continue
            if strict:
                raise PoolError(f"{problem}; fix or delete that line")
            if skipped is not None:
                skipped.append(problem)
    except OSError as exc:
        raise PoolError(f"{path}: cannot read: {exc.strerror or exc}") from None


def read_pool(path: str | Path, strict: bool = False) -> tuple[list[EnvProgram], list[str]]:
    """The programs of a pool directory (or a ``pool.jsonl`` path), in file order, and why each
    line that was left out could not be read (see :func:`load_pool`)."""
    path = Path(path)
    file = path / POOL_FILE if path.is_dir() else path
    if not file.exists():
        raise PoolError(f"no pool at {file}")
    programs, seen, skipped = [], set(), []
    for lineno, record in _read_jsonl(file, strict, skipped):
        extra = {key: record.pop(key) for key in _EXTRA_KEYS if key in record}
        record.pop("pool_format", None)
        meta = record.get("meta") or {}
        problem = None
        if not isinstance(meta, dict):
            problem = f"{file}: line {lineno}: 'meta' must be an object"
        else:
            record["meta"] = {**meta, **extra}
            try:
                program = EnvProgram.from_dict(record)
            except (TypeError, ValueError, RecursionError) as exc:
                problem = f"{file}: line {lineno}: not a valid program record: {exc}"
        if problem is not None:
            if strict:
                raise PoolError(problem)
            skipped.append(problem)
            continue
        if program.sha256 not in seen:
            seen.add(program.sha256)
            programs.append(program)
    return programs, skipped


def load_pool(path: str | Path, strict: bool = False) -> list[EnvProgram]:
    """The programs of a pool directory (or a ``pool.jsonl`` path), in file order.

    Every line should be a JSON object that ``EnvProgram.from_dict`` accepts once its
    ``validation``/``generation`` entries are moved into ``meta`` (and whose ``sha256`` matches
    the code). A line that is not is skipped with one warning for the file that counts them
    (see the module docstring), or, when ``strict``, raises :class:`PoolError` naming its line
    number. A program repeated on a later line is returned once. A missing pool raises
    :class:`PoolError`.
    """
    programs, skipped = read_pool(path, strict)
    if skipped:
        shown = "; ".join(terminal_text(s, markup=False, limit=300) for s in skipped[:3])
        log.warning("%d line(s) of the pool could not be read and were skipped (%d program(s) "
                    "loaded): %s%s", len(skipped), len(programs), shown,
                    "; ..." if len(skipped) > 3 else "")
    return programs


def _report_summary(report: Any) -> dict[str, Any]:
    d = report.details
    keep = ("class_name", "domain", "max_turns", "solution", "solution_turns", "ends", "tools",
            "garbage_best_reward", "has_solution")
    out = {"ok": report.ok, "stage": report.stage, "reason": report.reason,
           "message": report.message[:500]}
    out.update({k: d[k] for k in keep if k in d})
    out["ms"] = d.get("timings_ms", {}).get("total")
    return out


def write_pool(out: str | Path, entries: Iterable[tuple[EnvProgram, Any]]) -> dict[str, int]:
    """Append programs made elsewhere (imported, hand-written) to the pool directory ``out``,
    in the format above: each ``(program, validation report or None)`` whose report is valid
    (or absent) becomes a program file and a ``pool.jsonl`` line (its domain taken from the
    report when the program has none, ``validation`` from the report); an invalid one becomes a
    ``rejected.jsonl`` line (stage ``validate``). Programs already in the pool are skipped.
    Returns ``{"written", "rejected", "duplicate"}``."""
    out = Path(out)
    (out / PROGRAMS_DIR).mkdir(parents=True, exist_ok=True)
    known = {r.get("sha256") for _n, r in _read_jsonl(out / POOL_FILE, strict=False)}
    counts = {"written": 0, "rejected": 0, "duplicate": 0}
    with JsonlAppender(out / POOL_FILE) as pool_out, \
            JsonlAppender(out / REJECTED_FILE) as rejected_out:
        for program, report in entries:
            if report is not None and not report.ok:
                rejected_out.write({"stage": "validate", "reason": report.reason,
                                    "message": report.message[:500], "sha256": program.sha256,
                                    "lineage": dict(program.meta.get("lineage") or {}),
                                    "validation": _report_summary(report), "text": program.code,
                                    "written_at": _now()})
                counts["rejected"] += 1
                continue
            if program.sha256 in known:
                counts["duplicate"] += 1
                continue
            if report is not None:
                program = report.program or program
                if program.domain is None and report.details.get("domain") in ("games",
                                                                              "tooluse"):
                    program = dataclasses.replace(program, domain=report.details["domain"])
            _atomic_write(out / PROGRAMS_DIR / f"{program.short_id}.py",
                          _header(program, program.domain or "unknown") + program.code)
            record = program.to_dict()
            if report is not None:
                record["validation"] = _report_summary(report)
            record["generation"] = {"imported": True, "written_at": _now()}
            pool_out.write(record)
            known.add(program.sha256)
            counts["written"] += 1
    return counts


def _one_line(text: object) -> str:
    """``text`` on one line (every line break a space): comment text can never become code."""
    return " ".join(str(text).splitlines())


def _header(program: EnvProgram, setting: str) -> str:
    """The comment lines above a program file's code. The first line declares the encoding, so
    no text on the second (a skill such as ``coding: utf-7``) can choose another one."""
    hint = _one_line(program.hint or "(none)")
    return (f"# -*- coding: utf-8 -*- spadekit generated environment {program.short_id}\n"
            f"# skill: "
            f"{_one_line(program.skill)}   setting: {_one_line(setting)}   source: "
            f"{_one_line(program.source)}\n# hint: {hint}\n\n")
