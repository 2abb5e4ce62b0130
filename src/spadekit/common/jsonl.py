"""Crash-safe JSON-lines files: every record is flushed and fsynced before the next, and a torn
last line (the process died mid-write) is moved aside to ``<name>.partial`` before anything is
appended, so a new record never glues onto half an old one. Used by ``spadekit generate``'s pool
files and by the evaluation journal."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Iterable

__all__ = ["JsonlAppender", "repair_tail"]


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
