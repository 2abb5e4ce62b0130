"""Crash-safe JSON-lines files: every record is flushed and fsynced before the next, and a torn
last line (the process died mid-write) is moved aside to ``<name>.partial`` before anything is
appended, so a new record never glues onto half an old one. Used by ``spadekit generate``'s pool
files and by the evaluation journal.

:func:`read_jsonl` reads such a file back when it may come from elsewhere (a pool directory is
copied between machines): each line goes through ``spadekit.common.safe_json`` (no NaN or
Infinity, bounded depth) and is at most ``MAX_LINE_BYTES`` long, a longer one is never held in
memory whole; a bad line is handed to the caller as an ``UntrustedJsonError`` naming the file and
line, so the caller chooses to stop or to skip it."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Iterator

from spadekit.common.safe_json import MAX_DEPTH, UntrustedJsonError, decode

__all__ = ["MAX_LINE_BYTES", "JsonLine", "JsonlAppender", "read_jsonl", "repair_tail"]

MAX_LINE_BYTES = 16 * 1024 * 1024
"""The longest JSON-lines line :func:`read_jsonl` decodes (a pool line carries one program of at
most ``SandboxConfig.max_program_chars``, a million characters, plus its records)."""


def repair_tail(path: str | Path) -> bool:
    """Move a partial last line of ``path`` (no final newline) into ``<name>.partial`` and cut it
    off; True when there was one. A missing or empty file is left as it is."""
    path = Path(path)
    if not path.exists() or path.stat().st_size == 0:
        return False
    with open(path, "rb") as fh:
        fh.seek(-1, os.SEEK_END)
        if fh.read(1) == b"\n":  # whole: the usual case costs one byte, not the file
            return False
    data = path.read_bytes()
    cut = data.rfind(b"\n") + 1
    with open(path.with_name(path.name + ".partial"), "ab") as fh:
        fh.write(data[cut:] + b"\n")
        fh.flush()
        os.fsync(fh.fileno())
    with open(path, "r+b") as fh:
        fh.truncate(cut)
        fh.flush()
        os.fsync(fh.fileno())
    return True


class JsonlAppender:
    """Appends JSON objects to ``path`` (created with its folder), one fsynced line each, after
    :func:`repair_tail`. Use as a context manager or call :meth:`close`."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        repair_tail(self.path)
        self.fh = open(self.path, "a", encoding="utf-8")

    def write(self, record: dict[str, Any]) -> None:
        self.write_many([record])

    def write_many(self, records: Iterable[dict[str, Any]]) -> None:
        for record in records:
            self.fh.write(json.dumps(record, ensure_ascii=False) + "\n")
        self.fh.flush()
        os.fsync(self.fh.fileno())

    def close(self) -> None:
        self.fh.close()

    def __enter__(self) -> JsonlAppender:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


@dataclass(frozen=True)
class JsonLine:
    """One non-blank line of a JSON-lines file: its 1-based ``number`` and either its ``value``
    or the ``error`` that refused it."""

    number: int
    value: Any = None
    error: UntrustedJsonError | None = None


def read_jsonl(path: str | Path, *, max_line_bytes: int = MAX_LINE_BYTES,
               max_depth: int = MAX_DEPTH) -> Iterator[JsonLine]:
    """Every non-blank line of ``path`` (split at ``\\n``), decoded by
    ``spadekit.common.safe_json.decode`` (non-finite numbers refused). A line that is too long,
    not UTF-8 or not acceptable JSON comes back with its ``error`` set; ``OSError`` from opening
    or reading the file passes through."""
    with open(path, "rb") as fh:
        number = 0
        while True:
            raw = fh.readline(max_line_bytes + 2)
            if not raw:
                return
            number += 1
            if len(raw) > max_line_bytes + (raw.endswith(b"\n")):
                while raw and not raw.endswith(b"\n"):  # the rest, a megabyte at a time
                    raw = fh.readline(1 << 20)
                detail = f"longer than the {max_line_bytes} bytes allowed"
                yield JsonLine(number, error=UntrustedJsonError(
                    f"{path}: line {number}: {detail}", why="too_large", source=str(path),
                    line=number, detail=detail))
                continue
            if not raw.strip():
                continue
            try:
                value = decode(raw, source=str(path), line=number, max_depth=max_depth).value
            except UntrustedJsonError as exc:
                yield JsonLine(number, error=exc)
                continue
            yield JsonLine(number, value=value)
