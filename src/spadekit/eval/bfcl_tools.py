"""BFCL function docs as OpenAI tool schemas, and JSON tool calls as BFCL call strings (and back).

BFCL documents its simulated APIs in a dialect of JSON schema (``"type": "dict"`` for objects,
``"float"`` for numbers, ``"tuple"`` for arrays, ``"default": "None"`` for a Python None, a
``response`` block) and executes calls written as Python source, ``cd(folder='document')``. Its
executor ``eval``\\ s that source, so :func:`encode_call` only emits an ASCII identifier applied
to keyword arguments whose values are Python literals, and :func:`parse_call` accepts nothing but
a plain call with literal arguments.

Standard library only; nothing here imports ``bfcl_eval``.
"""

from __future__ import annotations

import ast
import keyword
import math
import re
from typing import Any, Iterable

from spadekit.envs import pyparse
from spadekit.envs.actions import format_tool_call

__all__ = ["CallError", "encode_call", "function_tool", "is_name", "parse_call", "to_json_schema",
           "tool_call_text"]

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_TYPES = {
    "dict": "object", "object": "object", "hashmap": "object",
    "float": "number", "double": "number", "number": "number",
    "integer": "integer", "int": "integer", "long": "integer", "short": "integer",
    "string": "string", "str": "string", "char": "string",
    "boolean": "boolean", "bool": "boolean",
    "array": "array", "list": "array", "tuple": "array", "arraylist": "array",
}
"""BFCL's parameter types -> JSON schema types; anything else (``any``) is left untyped."""
_MAX_DEPTH = 32


class CallError(ValueError):
    """A call that cannot be turned into (or read back from) a safe BFCL call string."""


def is_name(text: Any) -> bool:
    """True for an ASCII Python identifier that is not a keyword (a function or argument name)."""
    return (isinstance(text, str) and _NAME.fullmatch(text) is not None
            and not keyword.iskeyword(text))


def to_json_schema(fragment: Any, depth: int = 0) -> dict[str, Any]:
    """Translate one BFCL parameter schema (recursively) into standard JSON schema."""
    if not isinstance(fragment, dict) or depth > _MAX_DEPTH:
        return {}
    out: dict[str, Any] = {}
    kind = _TYPES.get(str(fragment.get("type", "")).lower())
    if kind:
        out["type"] = kind
    if isinstance(fragment.get("description"), str):
        out["description"] = fragment["description"]
    if isinstance(fragment.get("enum"), list):
        out["enum"] = list(fragment["enum"])
    if "default" in fragment and fragment["default"] not in ("None", None):
        out["default"] = fragment["default"]  # BFCL writes a Python None default as "None"
    if kind == "array" and isinstance(fragment.get("items"), dict):
        out["items"] = to_json_schema(fragment["items"], depth + 1)
    if isinstance(fragment.get("properties"), dict):
        out["properties"] = {str(name): to_json_schema(sub, depth + 1)
                             for name, sub in fragment["properties"].items()}
        required = fragment.get("required")
        if isinstance(required, list):
            out["required"] = [r for r in required if r in out["properties"]]
    return out


def function_tool(doc: dict[str, Any]) -> dict[str, Any]:
    """One BFCL function doc as an OpenAI-style tool: ``{"type": "function", "function": ...}``.

    The parameters are always an object schema with ``properties`` and ``required``; BFCL's
    ``response`` block (what the function returns) is not part of the schema and is dropped.
    """
    params = to_json_schema(doc.get("parameters") or {})
    params["type"] = "object"
    params.setdefault("properties", {})
    params.setdefault("required", [])
    return {"type": "function", "function": {"name": str(doc["name"]),
                                             "description": str(doc.get("description", "")),
                                             "parameters": params}}


def _check_literal(value: Any, depth: int = 0) -> None:
    """Raise CallError unless ``value`` is JSON-plain data whose ``repr`` is a Python literal."""
    if depth > _MAX_DEPTH:
        raise CallError("argument value is nested too deeply")
    if value is None or isinstance(value, (bool, int, str)):
        return
    if isinstance(value, float):
        if not math.isfinite(value):
            raise CallError(f"argument value {value!r} is not a finite number")
        return
    if isinstance(value, (list, tuple)):
        for item in value:
            _check_literal(item, depth + 1)
        return
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str):
                raise CallError("object keys in arguments must be strings")
            _check_literal(item, depth + 1)
        return
    raise CallError(f"argument values must be JSON data, got {type(value).__name__}")


def encode_call(name: str, arguments: dict[str, Any] | None = None) -> str:
    """``cd`` + ``{"folder": "document"}`` -> ``"cd(folder='document')"`` (keyword arguments,
    Python-literal reprs). Raises :class:`CallError` for a bad name, a bad argument name or a
    value that is not JSON data (the result is ``eval``-ed by BFCL, so nothing else gets in)."""
    if not is_name(name):
        raise CallError(f"{name!r} is not a valid function name")
    parts = []
    for key, value in (arguments or {}).items():
        if not is_name(key):
            raise CallError(f"argument name {key!r} is not a valid identifier")
        _check_literal(value)
        parts.append(f"{key}={value!r}")
    return f"{name}({', '.join(parts)})"


def parse_call(text: Any) -> tuple[str, list[Any], dict[str, Any]]:
    """Read a BFCL call string back: ``(name, positional values, keyword values)``.

    Only ``name(literal, ..., key=literal, ...)`` is accepted (BFCL's ground truth sometimes
    passes arguments positionally); anything else raises :class:`CallError`.
    """
    if not isinstance(text, str):
        raise CallError(f"a call must be a string, got {type(text).__name__}")
    try:
        node = pyparse.parse(text.strip(), mode="eval").body
        if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Name):
            raise CallError(f"not a plain function call: {text[:80]!r}")
        if not is_name(node.func.id):
            raise CallError(f"{node.func.id!r} is not a valid function name")
        args = [ast.literal_eval(arg) for arg in node.args]
        kwargs: dict[str, Any] = {}
        for kw in node.keywords:
            if kw.arg is None or not is_name(kw.arg):
                raise CallError(f"bad keyword argument in {text[:80]!r}")
            kwargs[kw.arg] = ast.literal_eval(kw.value)
    except CallError:
        raise
    except Exception as exc:  # SyntaxError, ValueError (non-literal), RecursionError, ...
        raise CallError(f"cannot read call {text[:80]!r}: {type(exc).__name__}") from None
    return node.func.id, args, kwargs


def tool_call_text(calls: Iterable[tuple[str, dict[str, Any]]]) -> str:
    """``<tool_call>`` blocks, one per ``(name, arguments)``, one per line."""
    return "\n".join(format_tool_call(name, arguments) for name, arguments in calls)
