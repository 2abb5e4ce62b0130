"""``ToolEnv``: a small base class for tool-use text environments.

A subclass defines tools as ``tool_<name>`` methods (called as ``<name>``) whose type hints and
Google-style docstring give the OpenAI schemas of :meth:`ToolEnv.tools`, and implements
``setup(rng) -> task text``, ``criteria()`` and ``solution()``. Each turn's ``<tool_call>`` blocks
are validated against the signatures and run in order; each result is one JSON line,
``{"tool": name, "result": ...}`` or ``{"tool": name, "error": ...}``. Intermediate rewards are
0.0; an ``<answer>`` ends the episode with the fraction of ``criteria()`` that hold; reaching
``max_turns`` first truncates with 0.0. Standard library only (sandbox workers import it).
"""

from __future__ import annotations

import inspect
import json
import random
import types
import typing
from typing import Any

from spadekit.envs.actions import extract_answer, parse_tool_calls

__all__ = ["ToolEnv", "ToolError", "python_type_schema"]

TOOL_PREFIX = "tool_"
_SECTION_HEADERS = {"args:", "arguments:", "parameters:", "returns:", "return:", "raises:",
                    "yields:", "examples:", "example:", "note:", "notes:"}
_SIMPLE = {str: "string", int: "integer", float: "number", bool: "boolean",
           list: "array", tuple: "array", dict: "object", type(None): "null"}
_PYTHON_TYPES = {"string": str, "integer": int, "number": float, "boolean": bool,
                 "array": list, "object": dict, "null": type(None)}


class ToolError(Exception):
    """Raised inside a tool to report a domain error (e.g. 'unknown SKU') to the agent."""


def python_type_schema(hint: Any) -> dict[str, Any]:
    """Translate a type hint into a JSON schema fragment (``{}`` means any value)."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if isinstance(hint, type) and hint in _SIMPLE:
        return {"type": _SIMPLE[hint]}
    if origin is typing.Literal:
        return {"enum": list(args)}
    if origin in (typing.Union, types.UnionType):
        non_null = [a for a in args if a is not type(None)]
        parts = [python_type_schema(a) for a in non_null]
        if len(non_null) < len(args):
            if len(parts) == 1 and isinstance(parts[0].get("type"), str):
                return {**parts[0], "type": [parts[0]["type"], "null"]}
            parts.append({"type": "null"})
        return parts[0] if len(parts) == 1 else {"anyOf": parts}
    if origin in (list, tuple, set, frozenset):
        schema: dict[str, Any] = {"type": "array"}
        if args and args[0] is not Ellipsis:
            schema["items"] = python_type_schema(args[0])
        return schema
    if origin is dict:
        return {"type": "object"}
    return {}


def _check(value: Any, hint: Any) -> tuple[bool, Any]:
    """Check ``value`` against ``hint``: (ok, value coerced where lossless, e.g. 3.0 -> 3)."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        for arg in args:
            ok, coerced = _check(value, arg)
            if ok:
                return True, coerced
        return False, value
    if origin is typing.Literal:
        return value in args, value
    kind = python_type_schema(hint).get("type")
    if kind is None:  # Any, missing or unknown annotation
        return True, value
    if isinstance(value, bool) and kind in ("integer", "number"):
        return False, value
    if kind == "integer" and isinstance(value, float) and value.is_integer():
        return True, int(value)
    if kind == "number" and isinstance(value, int):
        return True, float(value)
    if kind == "array" and isinstance(value, list) and args and args[0] is not Ellipsis:
        checked = [_check(item, args[0]) for item in value]
        return all(ok for ok, _ in checked), [item for _, item in checked]
    return isinstance(value, _PYTHON_TYPES[kind]), value


def _params(method: Any) -> dict[str, inspect.Parameter]:
    """The named parameters of a bound tool method (``*args``/``**kwargs`` are not tools' API)."""
    return {p.name: p for p in inspect.signature(method).parameters.values()
            if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)}


def _plain(value: Any) -> Any:
    """A JSON-plain copy of a tool result (tuples become lists, odd objects strings)."""
    try:
        return json.loads(json.dumps(value, default=str))
    except (TypeError, ValueError):  # e.g. circular references
        return str(value)


def _type_name(schema: dict[str, Any]) -> str:
    """Short human-readable type of a schema fragment, for tool listings and error messages."""
    if "enum" in schema:
        return "one of " + "/".join(map(str, schema["enum"]))
    kind = schema.get("type", "any")
    return "|".join(kind) if isinstance(kind, list) else kind


def _parse_docstring(doc: str) -> tuple[str, dict[str, str]]:
    """Split a docstring into (first paragraph, {param: description} from its ``Args:`` section)."""
    lines = inspect.cleandoc(doc or "").splitlines()
    summary: list[str] = []
    for line in lines:
        if not line.strip() or line.strip().lower() in _SECTION_HEADERS:
            break
        summary.append(line.strip())
    params: dict[str, str] = {}
    in_args, current, base_indent = False, None, 0
    for line in lines:
        stripped = line.strip()
        if stripped.lower() in _SECTION_HEADERS:
            in_args = stripped.lower() in ("args:", "arguments:", "parameters:")
            current, base_indent = None, 0
            continue
        if not in_args or not stripped:
            continue
        indent = len(line) - len(line.lstrip())
        head, sep, desc = stripped.partition(":")
        name = head.split("(")[0].strip()
        if sep and name.isidentifier() and (current is None or indent <= base_indent):
            current, base_indent = name, indent
            params[name] = desc.strip()
        elif current is not None:  # continuation line
            params[current] = (params[current] + " " + stripped).strip()
    return " ".join(summary), params


class ToolEnv:
    """Base class for tool-use environments (see the module docstring)."""

    max_calls_per_turn = 16  # further calls in one turn are rejected, not run
    max_result_chars = 4000  # longer rendered results are cut

    def __init__(self, max_turns: int = 12, **kwargs: Any) -> None:
        self.max_turns = int(max_turns)
        self.options: dict[str, Any] = dict(kwargs)
        self.state: dict[str, Any] = {}
        self.rng = random.Random()
        self.reset_options: dict[str, Any] = {}
        self.turn, self.done, self.task = 0, True, ""

    # ----- to implement in subclasses -------------------------------------------------------
    def setup(self, rng: random.Random) -> str:
        """Build the hidden state (in ``self.state`` or attributes) and return the task text."""
        raise NotImplementedError

    def criteria(self) -> dict[str, bool]:
        """Named success checks over the current state; reward = fraction that hold."""
        raise NotImplementedError

    def solution(self) -> list[str]:
        """Raw actions that reach reward 1.0 from the current reset state."""
        raise NotImplementedError

    # ----- tools --------------------------------------------------------------------------------
    def _tool_methods(self) -> dict[str, Any]:
        return {name[len(TOOL_PREFIX):]: getattr(self, name) for name in sorted(dir(self))
                if name.startswith(TOOL_PREFIX) and len(name) > len(TOOL_PREFIX)
                and callable(getattr(self, name))}

    @staticmethod
    def _hints(method: Any) -> dict[str, Any]:
        try:
            return typing.get_type_hints(method)
        except Exception:  # unresolvable annotation: treat its parameter as untyped
            return {}

    def tools(self) -> list[dict[str, Any]]:
        """OpenAI-style function schemas for every ``tool_<name>`` method."""
        schemas = []
        for name, method in self._tool_methods().items():
            description, arg_docs = _parse_docstring(inspect.getdoc(method) or "")
            hints, properties, required = self._hints(method), {}, []
            for param in _params(method).values():
                prop = python_type_schema(hints.get(param.name, Any))
                if param.name in arg_docs:
                    prop["description"] = arg_docs[param.name]
                properties[param.name] = prop
                if param.default is param.empty:
                    required.append(param.name)
            parameters = {"type": "object", "properties": properties, "required": required}
            schemas.append({"type": "function", "function": {
                "name": name, "description": description or name, "parameters": parameters}})
        return schemas

    def call_tool(self, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
        """Validate and run one call: ``{"tool": name, "result": ...}`` or ``{"tool", "error"}``."""
        methods = self._tool_methods()
        if name not in methods:
            known = ", ".join(methods)
            return {"tool": name, "error": f"unknown tool '{name}'; available: {known}"}
        method, hints = methods[name], self._hints(methods[name])
        params = _params(method)
        extra = sorted(set(arguments) - set(params))
        if extra:
            return {"tool": name, "error": f"unexpected argument(s): {', '.join(extra)}; "
                                           f"expected: {', '.join(params) or 'none'}"}
        missing = [p for p, spec in params.items()
                   if spec.default is spec.empty and p not in arguments]
        if missing:
            return {"tool": name, "error": f"missing required argument(s): {', '.join(missing)}"}
        kwargs = {}
        for key, value in arguments.items():
            ok, kwargs[key] = _check(value, hints.get(key, Any))
            if not ok:
                expected = _type_name(python_type_schema(hints[key]))
                return {"tool": name, "error": f"argument '{key}' must be of type {expected}, "
                                               f"got {json.dumps(value)[:60]}"}
        try:
            return {"tool": name, "result": _plain(method(**kwargs))}
        except ToolError as exc:
            return {"tool": name, "error": str(exc)}
        except Exception as exc:  # a bug or odd input must not crash the episode
            return {"tool": name, "error": f"internal error: {type(exc).__name__}: {exc}"}

    def _render(self, record: dict[str, Any]) -> str:
        text = json.dumps(record, default=str, ensure_ascii=False)
        limit = self.max_result_chars
        return text if len(text) <= limit else text[:limit] + "...(cut)"

    # ----- episode ------------------------------------------------------------------------------
    def score(self) -> float:
        """Fraction of ``criteria()`` that hold (0.0 if there are none)."""
        checks = self.criteria()
        return sum(bool(v) for v in checks.values()) / len(checks) if checks else 0.0

    def reset(self, seed: int | None = None,
              options: dict[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
        """Start an episode: seed ``self.rng``, run :meth:`setup`, return (task + tool list, info).

        ``options`` is kept as ``self.reset_options`` for :meth:`setup` to read.
        """
        self.rng = random.Random(seed)
        self.state, self.turn, self.done = {}, 0, False
        self.reset_options = dict(options or {})
        self.task = self.setup(self.rng)
        listing = []
        for schema in self.tools():
            fn = schema["function"]
            props = fn["parameters"]["properties"]
            args = ", ".join(f"{p}: {_type_name(s)}" for p, s in props.items())
            listing.append(f"- {fn['name']}({args}): {fn['description']}")
        obs = (f"{self.task}\n\nAvailable tools:\n" + "\n".join(listing) +
               '\n\nCall tools as <tool_call>{"name": "...", "arguments": {...}}</tool_call> '
               "(several per turn allowed). When finished, reply <answer>done</answer>.")
        return obs, {"tools": self.tools(), "seed": seed}

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        """Run the turn's tool calls; an ``<answer>`` ends the episode with the criteria score."""
        if self.done:
            return "The episode is over; call reset() to start a new one.", 0.0, True, False, {}
        self.turn += 1
        text = action if isinstance(action, str) else ""
        cap = self.max_calls_per_turn
        calls, errors = parse_tool_calls(text, strict=False, limit=cap + 1)
        answer = extract_answer(text)
        overflow = len(calls) + len(errors) > cap
        errors = errors[:5]  # enough to show the agent what is wrong
        lines = [self._render({"error": f"malformed tool call: {err}"}) for err in errors]
        results = [self.call_tool(c.name, c.arguments) for c in calls[:cap]]
        lines += [self._render(record) for record in results]
        if overflow:
            lines.append(self._render(
                {"error": f"too many calls in one turn (max {cap}); the rest were not run"}))
        info: dict[str, Any] = {"tool_results": results, "parse_errors": [str(e) for e in errors]}
        if answer is not None:
            self.done = True
            checks = {name: bool(ok) for name, ok in self.criteria().items()}
            info["criteria"] = checks
            lines.append(f"Episode finished: {sum(checks.values())}/{len(checks)} checks passed.")
            reward = sum(checks.values()) / len(checks) if checks else 0.0
            return "\n".join(lines), reward, True, False, info
        if not calls and not errors:
            lines.append('Format error: no tool call found. Call a tool with <tool_call>{"name": '
                         '"...", "arguments": {...}}</tool_call>, or finish with '
                         '<answer>done</answer>.')
        truncated = self.turn >= self.max_turns
        if truncated:
            self.done = True
            lines.append(f"Turn limit ({self.max_turns}) reached; the episode ends unfinished.")
        return "\n".join(lines), 0.0, False, truncated, info

