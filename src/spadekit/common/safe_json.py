"""One hardened JSON decoder for files spadekit did not write itself (a reference run's memory
file, a copied pool directory, a results file handed over).

:func:`loads` and :func:`load_file` are bounded in size and depth, refuse lone surrogates and
over-long integers, and raise one typed error, :class:`UntrustedJsonError` (a ``ConfigError``)
naming the file and line. Non-finite numbers (``NaN``, ``Infinity``, ``1e999``) are refused, or
read as ``None`` with ``nonfinite="null"`` and counted in :attr:`Decoded.nonfinite`.
``spadekit.common.jsonl.read_jsonl`` uses the same decoder. Standard library only.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from spadekit.common.errors import ConfigError

__all__ = ["MAX_DEPTH", "MAX_DOCUMENT_BYTES", "Decoded", "UntrustedJsonError", "decode",
           "load_file", "loads"]

MAX_DEPTH = 64
"""Arrays and objects nested deeper than this are refused (spadekit's own records nest under
ten deep; the interpreter's recursion limit is about 1000)."""
MAX_DOCUMENT_BYTES = 256 * 1024 * 1024
"""The largest whole file :func:`load_file` reads (a reference memory file of 10,000 records
with 2,000-character snippets is about 25 MB)."""

_SURROGATE = re.compile("[\ud800-\udfff]")


class UntrustedJsonError(ConfigError):
    """A JSON document (or JSON-lines line) that spadekit refuses to read. ``why`` is a stable
    code: ``not_json``, ``non_finite``, ``too_deep``, ``too_large``, ``not_utf8``,
    ``bad_text`` (a lone surrogate), ``unreadable`` (the file could not be opened); ``detail``
    is the message without the file and line, for callers that name those their own way."""

    reason = "untrusted_json"

    def __init__(self, message: str, why: str = "not_json", source: str = "",
                 line: int | None = None, detail: str = "") -> None:
        super().__init__(message, why=why, source=source, line=line)
        self.why = why
        self.source = source
        self.line = line
        self.detail = detail or message


@dataclass(frozen=True)
class Decoded:
    """A decoded document and how many non-finite numbers were read as ``None``."""

    value: Any
    nonfinite: int = 0


class _NonFinite(Exception):
    def __init__(self, text: str) -> None:
        super().__init__(text)
        self.text = text


def _where(source: str, line: int | None) -> str:
    place = source or "<json>"
    return f"{place}: line {line}" if line is not None else place


def _fail(why: str, detail: str, source: str, line: int | None) -> UntrustedJsonError:
    return UntrustedJsonError(f"{_where(source, line)}: {detail}", why=why, source=source,
                              line=line, detail=detail)


def decode(text: str | bytes, *, source: str = "", line: int | None = None,
           max_depth: int = MAX_DEPTH, max_chars: int | None = None,
           nonfinite: str = "reject") -> Decoded:
    """``text`` as ``json.loads`` reads it, within the bounds above (see the module docstring);
    raises only :class:`UntrustedJsonError`. ``source``/``line`` name where the text came from
    in messages; ``line`` is the JSON-lines line (for a whole document the error's own line is
    added)."""
    if nonfinite not in ("reject", "null"):
        raise ValueError(f"nonfinite must be 'reject' or 'null', not {nonfinite!r}")
    if max_chars is not None and len(text) > max_chars:
        raise _fail("too_large", f"{len(text)} characters, more than the {max_chars} allowed",
                    source, line)
    if isinstance(text, (bytes, bytearray)):
        try:
            text = bytes(text).decode("utf-8")
        except UnicodeDecodeError as exc:
            raise _fail("not_utf8", f"not UTF-8 (byte {exc.start})", source, line) from None
    count = [0]

    def constant(name: str) -> Any:  # NaN, Infinity, -Infinity
        if nonfinite == "null":
            count[0] += 1
            return None
        raise _NonFinite(name)

    def number(literal: str) -> Any:  # 1e999 is a finite-looking literal of infinity
        value = float(literal)
        if math.isfinite(value):
            return value
        return constant(literal)

    try:
        value = json.loads(text, parse_constant=constant, parse_float=number)
    except _NonFinite as exc:
        raise _fail("non_finite", f"the non-finite number {exc.text[:40]} is not allowed "
                    "(JSON has no NaN or Infinity)", source, line) from None
    except RecursionError:
        raise _fail("too_deep", f"nested deeper than {max_depth} levels", source,
                    line) from None
    except json.JSONDecodeError as exc:
        raise _fail("not_json", f"not valid JSON ({exc.msg}, column {exc.colno})", source,
                    line if line is not None else exc.lineno) from None
    except ValueError as exc:  # an integer past sys.get_int_max_str_digits()
        raise _fail("not_json", f"not readable JSON ({str(exc)[:120]})", source,
                    line) from None
    _check(value, max_depth, source, line)
    return Decoded(value, count[0])


def _check(value: Any, max_depth: int, source: str, line: int | None) -> None:
    """Depth and text of a decoded value, without recursion."""
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, str):
            if _SURROGATE.search(item):
                raise _fail("bad_text", "a string holds a lone UTF-16 surrogate (not valid "
                            "Unicode)", source, line)
            continue
        if not isinstance(item, (list, dict)):
            continue
        if depth > max_depth:
            raise _fail("too_deep", f"nested deeper than {max_depth} levels", source, line)
        if isinstance(item, dict):
            stack.extend((k, depth) for k in item)
            stack.extend((v, depth + 1) for v in item.values())
        else:
            stack.extend((v, depth + 1) for v in item)


def loads(text: str | bytes, *, source: str = "", line: int | None = None,
          max_depth: int = MAX_DEPTH, max_chars: int | None = None) -> Any:
    """The value of ``text``; refuses non-finite numbers (see :func:`decode`)."""
    return decode(text, source=source, line=line, max_depth=max_depth,
                  max_chars=max_chars).value


def load_file(path: str | Path, *, max_bytes: int = MAX_DOCUMENT_BYTES,
              max_depth: int = MAX_DEPTH, nonfinite: str = "reject") -> Decoded:
    """The JSON document in the file ``path``: at most ``max_bytes`` are read (a special file
    such as ``/dev/zero`` included), then :func:`decode`."""
    path = Path(path)
    try:
        with open(path, "rb") as fh:
            data = fh.read(max_bytes + 1)
    except OSError as exc:
        raise UntrustedJsonError(f"{path}: cannot read: {exc.strerror or exc}",
                                 why="unreadable", source=str(path)) from None
    if len(data) > max_bytes:
        raise _fail("too_large", f"larger than the {max_bytes} bytes allowed", str(path), None)
    return decode(data, source=str(path), max_depth=max_depth, nonfinite=nonfinite)
