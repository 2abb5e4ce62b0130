"""The schema of every reply a sandbox worker sends, checked before anything else reads it.

Every reply line is untrusted bytes (the program can forge them). ``decode_line`` turns one line
into a value safe to hand on, or raises ``BadReply`` (``Sandbox`` turns that into a
``ProtocolViolation`` and kills the worker). Checks, cheapest first: nesting depth on the raw
bytes before parsing (``MAX_DEPTH``); strict UTF-8 and JSON without NaN/Infinity or overflowing
floats; no lone surrogates; the envelope ``{"id", "ok", "result"|"error"}`` with the request's
int id; per message type ``check_hello``/``check_load``/``check_create``/``check_error``. Sizes
are bounded by ``SandboxConfig.max_reply_bytes`` and per field. A well-behaved worker never
sends anything refused here, so a refusal means the worker is not to be trusted.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

from spadekit.sandbox.worker_replies import valid_text  # one test of valid Unicode, both sides

MAX_DEPTH = 32
"""Deepest nesting of arrays/objects in one reply line (envelope included). The worker cuts
``info`` and method results deeper than 16 levels, so honest replies stay far below this."""

TURNS_CEILING = 1000
"""Upper bound of a program's ``max_turns`` when the caller passes no cap of its own."""

MAX_NAME_CHARS = 200
MAX_DOC_CHARS = 500
MAX_ERROR_FIELD_CHARS = {"message": 4000, "traceback": 8000, "exc_type": 200, "reason": 64,
                         "kind": 32, "type": 64}
ERROR_KINDS = frozenset({"EnvRaised", "ProgramLoadError", "ResourceLimit", "InvalidResult",
                         "ProtocolViolation", "SandboxStartError"})


class BadReply(ValueError):
    """A reply broke its schema; the message says how (never echoes the hostile bytes)."""


_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"?', re.DOTALL)
_PAIR = re.compile(rb"[\[{][\]}]")
_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")


def _depth_ok(line: bytes) -> bool:
    """True when ``line`` nests arrays/objects at most ``MAX_DEPTH`` deep. Strings are removed
    first (an unterminated one runs to the end of the line: linear, no backtracking), then every
    pass deletes the innermost bracket pairs; a line that is not empty after ``MAX_DEPTH``
    passes is too deep or unbalanced, and either way not a reply."""
    brackets = _STRING.sub(b"", line).translate(None, _NOT_BRACKETS)
    for _ in range(MAX_DEPTH):
        if not brackets:
            return True
        reduced = _PAIR.sub(b"", brackets)
        if len(reduced) == len(brackets):
            return False  # unbalanced: nothing left to peel
        brackets = reduced
    return not brackets


def _refuse_constant(name: str) -> Any:
    raise BadReply(f"{name} is not a JSON number")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise BadReply("a number overflows to infinity")
    return value


_DECODER = json.JSONDecoder(parse_constant=_refuse_constant, parse_float=_finite_float)
_SCAN = _DECODER.scan_once  # the C scanner, with the two hooks above


def decode_line(line: bytes) -> Any:
    """One reply line -> its JSON value, or ``BadReply``. Never raises anything else."""
    try:
        if (line.count(b"[") + line.count(b"{") > MAX_DEPTH) and not _depth_ok(line):
            raise BadReply(f"nested deeper than {MAX_DEPTH} levels")
        text = line.decode("utf-8")  # strict: no invalid bytes, no encoded surrogates
        value = _parse(text)
        if "\\u" in text or not text.isascii():
            _check_strings(value)
        return value
    except BadReply:
        raise
    except (ValueError, RecursionError, MemoryError, OverflowError, TypeError) as exc:
        raise BadReply(f"not a JSON reply ({type(exc).__name__})") from None


def _parse(text: str) -> Any:
    """``_DECODER.decode(text)``, same result and same errors, without its Python-level regex
    passes on the usual line (one value from the first character, then nothing but JSON
    whitespace): the decoder's C scanner reads it directly, about 1.5 us less per reply."""
    try:
        value, end = _SCAN(text, 0)
    except StopIteration:  # leading whitespace, or no value at all: the full decoder decides
        return _DECODER.decode(text)
    if end != len(text) and text[end:].strip(" \t\n\r"):
        raise BadReply("not a JSON reply (JSONDecodeError)")  # extra data, as decode says
    return value


def _check_strings(value: Any) -> None:
    stack = [value]
    while stack:
        item = stack.pop()
        if type(item) is str:
            if not valid_text(item):
                raise BadReply("a string holds a lone surrogate (not valid Unicode)")
        elif type(item) is dict:
            for key, sub in item.items():
                if not valid_text(key):
                    raise BadReply("a key holds a lone surrogate (not valid Unicode)")
                stack.append(sub)
        elif type(item) is list:
            stack.extend(item)


def envelope(msg: Any, rid: int) -> tuple[bool, Any]:
    """``(ok, result-or-error)`` of a decoded reply to request ``rid``, or ``BadReply``."""
    if type(msg) is not dict or len(msg) != 3:
        raise BadReply("a reply must be an object with exactly id, ok and result/error")
    got = msg.get("id")
    if type(got) is not int or got != rid:
        raise BadReply("the reply's id is not the request's")
    ok = msg.get("ok")
    if ok is True and "result" in msg:
        return True, msg["result"]
    if ok is False and "error" in msg:
        return False, msg["error"]
    raise BadReply("a reply needs ok: true with result, or ok: false with error")


def _is_int(value: Any) -> bool:
    return type(value) is int


def _text(value: Any, limit: int, what: str, allow_empty: bool = True) -> str:
    if type(value) is not str or len(value) > limit or (not allow_empty and not value):
        raise BadReply(f"{what} must be a string of at most {limit} characters")
    return value


def check_error(err: Any) -> dict:
    """An error object: a known ``type``, string fields within their sizes, ``line`` an int."""
    if type(err) is not dict:
        raise BadReply("an error reply must carry an object")
    kind = err.get("type")
    if type(kind) is not str or kind not in ERROR_KINDS:
        raise BadReply("unknown error type")
    out: dict = {}
    for key, value in err.items():
        if key in MAX_ERROR_FIELD_CHARS:
            out[key] = _text(value, MAX_ERROR_FIELD_CHARS[key], f"error field {key}")
        elif key == "line":
            if value is not None and not _is_int(value):
                raise BadReply("error field line must be an int or null")
            out[key] = value
        else:
            raise BadReply("unknown error field")
    out.setdefault("message", "")
    return out


def check_hello(result: Any) -> dict:
    if type(result) is not dict or result.get("ready") is not True:
        raise BadReply("the worker's hello must be {ready: true, layers: {...}}")
    layers = result.get("layers", {})
    if type(layers) is not dict:
        raise BadReply("the worker's layers must be an object")
    return {"ready": True, "layers": layers}


def check_load(result: Any) -> dict:
    """``{class_name, has_solution, has_tools, doc}`` with exactly those types."""
    if type(result) is not dict or set(result) != {"class_name", "has_solution", "has_tools",
                                                   "doc"}:
        raise BadReply("a load reply must be {class_name, has_solution, has_tools, doc}")
    name = _text(result["class_name"], MAX_NAME_CHARS, "class_name", allow_empty=False)
    if not name.endswith("Env") or not name.isidentifier():
        raise BadReply("class_name must be a Python identifier ending in 'Env'")
    if type(result["has_solution"]) is not bool or type(result["has_tools"]) is not bool:
        raise BadReply("has_solution and has_tools must be booleans")
    return {"class_name": name, "has_solution": result["has_solution"],
            "has_tools": result["has_tools"],
            "doc": _text(result["doc"], MAX_DOC_CHARS, "doc")}


def check_create(result: Any, cap: int | None) -> tuple[int, int | None]:
    """``(instance, max_turns)`` of a create reply. ``max_turns`` must be an int or null (never a
    bool or a string); a positive one is clamped to ``cap`` (``TURNS_CEILING`` without one), a
    value below 1 states no usable cap and becomes ``None`` (the caller's own cap applies)."""
    if type(result) is not dict or set(result) != {"instance", "max_turns"}:
        raise BadReply("a create reply must be {instance, max_turns}")
    instance, turns = result["instance"], result["max_turns"]
    if not _is_int(instance) or not 0 < instance < 2 ** 53:
        raise BadReply("instance must be a positive int")
    if turns is None:
        return instance, None
    if not _is_int(turns):
        raise BadReply("max_turns must be an int or null")
    return instance, clamp_turns(turns, cap)


def clamp_turns(turns: int, cap: int | None) -> int | None:
    """A program's ``max_turns`` within ``[1, cap]``; ``None`` when it is below 1."""
    if turns < 1:
        return None
    limit = cap if cap is not None and cap >= 1 else TURNS_CEILING
    return min(turns, limit)
