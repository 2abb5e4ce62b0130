"""Parsers for the two action conventions of spadekit environments.

Games: the environment reads the *last* top-level ``\\boxed{<command>}`` of the turn
(:func:`extract_boxed`). Tool use: ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``
blocks (:func:`parse_tool_calls`) and a final ``<answer>...</answer>`` (:func:`extract_answer`);
prose around the tags is ignored. Every parser is linear in its input; a call nested deeper than
:data:`MAX_JSON_DEPTH` or holding an unconvertible integer is :class:`ActionParseError`, never a
``RecursionError``. Standard library only: sandbox workers import this module.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any, Literal, NamedTuple, overload

__all__ = [
    "ActionParseError",
    "ParsedToolCalls",
    "ToolCall",
    "boxed",
    "extract_answer",
    "extract_boxed",
    "format_tool_call",
    "parse_tool_calls",
]

_BOX_OPEN = re.compile(r"\\boxed\s*\{")
_TOOL_CALL = re.compile(
    r"<tool_call>(.*?)(?:</tool_call>|(?=<tool_call>)|\Z)", re.DOTALL | re.IGNORECASE
)
_ANSWER_OPEN = re.compile(r"<answer>", re.IGNORECASE)
_ANSWER_CLOSE = re.compile(r"</answer>", re.IGNORECASE)
_BRACES = re.compile(r"[{}]")
_INFO = re.compile(r"[A-Za-z]*")
_JSON_STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"?', re.DOTALL)
_NOT_BRACKETS = {c: None for c in range(128) if chr(c) not in "[]{}"}

MAX_JSON_DEPTH = 64
"""A tool call whose JSON nests arrays/objects deeper than this is malformed."""


class ActionParseError(ValueError):
    """A malformed action: an unbalanced tag, invalid JSON, a missing name, non-object arguments.

    ``index`` is the 0-based position of the offending ``<tool_call>`` block in the text (or None)
    and ``snippet`` a short excerpt of it, so that the message can be shown to the agent.
    """

    def __init__(self, message: str, *, index: int | None = None, snippet: str = "") -> None:
        super().__init__(message)
        self.index = index
        self.snippet = snippet


@dataclass(frozen=True)
class ToolCall:
    """One parsed tool call: the tool's name and its (JSON object) arguments."""

    name: str
    arguments: dict[str, Any] = field(default_factory=dict)


class ParsedToolCalls(NamedTuple):
    """Result of ``parse_tool_calls(text, strict=False)``: the valid calls and the errors."""

    calls: list[ToolCall]
    errors: list[ActionParseError]


def extract_boxed(text: str) -> str | None:
    """Return the content of the last top-level ``\\boxed{...}`` in ``text``, stripped.

    Braces inside the box must balance (``\\boxed{f(x) = {1, 2}}`` gives ``f(x) = {1, 2}``); a box
    nested in another box belongs to the outer one. Returns None when there is no box or when a
    box is left unclosed.
    """
    if not isinstance(text, str):
        return None
    result: str | None = None
    pos = 0
    while True:
        match = _BOX_OPEN.search(text, pos)
        if match is None:
            return result
        start, depth, end = match.end(), 1, None
        for brace in _BRACES.finditer(text, start):  # one pass: the braces only
            depth += 1 if brace.group() == "{" else -1
            if not depth:
                end = brace.start()
                break
        if end is None:
            return None  # unclosed box: the turn's command cannot be trusted
        result = text[start:end].strip()
        pos = end + 1


def boxed(command: str) -> str:
    """Wrap ``command`` as ``\\boxed{command}`` (the inverse of :func:`extract_boxed`)."""
    return "\\boxed{" + str(command) + "}"


def extract_answer(text: str) -> str | None:
    """Return the stripped content of the last ``<answer>...</answer>`` in ``text``, or None.

    Linear time: the last ``<answer>`` that opens before the last ``</answer>``, up to the first
    ``</answer>`` after it (tags are case-insensitive). Thousands of unclosed tags cost one scan.
    """
    if not isinstance(text, str):
        return None
    closes = [m.start() for m in _ANSWER_CLOSE.finditer(text)]
    if not closes:
        return None
    opens = [m.end() for m in _ANSWER_OPEN.finditer(text, 0, closes[-1])]
    if not opens:
        return None
    start = opens[-1]
    end = next(c for c in closes if c >= start)
    return text[start:end].strip()


def format_tool_call(name: str, arguments: dict[str, Any] | None = None) -> str:
    """Render a call as ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``.

    A ``<`` inside a string value is written as the JSON escape ``\\u003c`` so that text such as
    ``</tool_call>`` in an argument cannot end the block early; the call still parses back exactly.
    """
    payload = {"name": name, "arguments": dict(arguments or {})}
    body = json.dumps(payload, ensure_ascii=False).replace("<", "\\u003c")
    return "<tool_call>" + body + "</tool_call>"


def _unfenced(text: str) -> str:
    """The content of a ```` ```json ... ``` ```` fence around the whole of ``text`` (which is
    stripped), else ``text``: an info string of letters after the opening, whitespace around
    the content dropped (no regular expression: a fence of spaces costs one pass)."""
    if len(text) < 6 or not (text.startswith("```") and text.endswith("```")):
        return text
    info = _INFO.match(text, 3)
    start = info.end() if info else 3
    return text[start:len(text) - 3].strip()


def _too_deep(text: str) -> bool:
    """Whether the JSON ``text`` nests arrays/objects deeper than ``MAX_JSON_DEPTH`` (strings
    skipped; one pass, before the recursive parser sees it)."""
    if text.count("[") + text.count("{") <= MAX_JSON_DEPTH:
        return False
    depth = 0
    for ch in _JSON_STRING.sub("", text).translate(_NOT_BRACKETS):
        depth += 1 if ch in "[{" else -1
        if depth > MAX_JSON_DEPTH:
            return True
    return False


def _loads(text: str) -> Any:
    """``json.loads`` that raises only ``ValueError``: too deep (checked first), an integer
    too long to convert, any other malformed JSON."""
    if _too_deep(text):
        raise ValueError(f"nested deeper than {MAX_JSON_DEPTH} levels")
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{exc.msg} at char {exc.pos}") from None
    except (ValueError, RecursionError, MemoryError) as exc:
        raise ValueError(type(exc).__name__ if isinstance(exc, (RecursionError, MemoryError))
                         else str(exc)) from None


def _parse_one(body: str, index: int) -> ToolCall:
    """Parse the JSON body of one ``<tool_call>`` block; raise ActionParseError if malformed."""
    snippet = body.strip()[:120]
    text = _unfenced(body.strip())  # tolerate a ```json ... ``` fence inside the tag
    if not text:
        raise ActionParseError(f"tool call #{index + 1} is empty", index=index, snippet=snippet)
    try:
        payload = _loads(text)
    except ValueError as exc:
        raise ActionParseError(
            f"tool call #{index + 1} is not valid JSON ({exc})",
            index=index,
            snippet=snippet,
        ) from None
    if not isinstance(payload, dict):
        raise ActionParseError(
            f"tool call #{index + 1} must be a JSON object with 'name' and 'arguments'",
            index=index,
            snippet=snippet,
        )
    name = payload.get("name")
    if not isinstance(name, str) or not name.strip():
        raise ActionParseError(
            f"tool call #{index + 1} needs a non-empty string 'name'", index=index, snippet=snippet
        )
    arguments = payload.get("arguments", {})
    if isinstance(arguments, str):  # OpenAI style: arguments serialised as a JSON string
        try:
            arguments = _loads(arguments) if arguments.strip() else {}
        except ValueError:
            pass
    if arguments is None:
        arguments = {}
    if not isinstance(arguments, dict):
        raise ActionParseError(
            f"tool call #{index + 1} ('{name}'): 'arguments' must be a JSON object, "
            f"got {type(arguments).__name__}",
            index=index,
            snippet=snippet,
        )
    return ToolCall(name=name.strip(), arguments=arguments)


@overload
def parse_tool_calls(
    text: str, strict: Literal[True] = ..., *, limit: int | None = ...
) -> list[ToolCall]: ...
@overload
def parse_tool_calls(
    text: str, strict: Literal[False], *, limit: int | None = ...
) -> ParsedToolCalls: ...
def parse_tool_calls(
    text: str, strict: bool = True, *, limit: int | None = None
) -> list[ToolCall] | ParsedToolCalls:
    """Parse every ``<tool_call>{"name": str, "arguments": object}</tool_call>`` block in order.

    ``arguments`` may be omitted or a JSON string encoding an object; a block without its closing
    tag runs to the next ``<tool_call>`` or the end. ``strict=True`` returns the calls and raises
    :class:`ActionParseError` on the first malformed block; ``strict=False`` never raises and
    returns ``ParsedToolCalls(calls, errors)``. ``limit`` caps how many blocks are read.
    """
    calls: list[ToolCall] = []
    errors: list[ActionParseError] = []
    if isinstance(text, str):
        for index, match in enumerate(_TOOL_CALL.finditer(text)):
            if limit is not None and index >= limit:
                break
            try:
                calls.append(_parse_one(match.group(1), index))
            except ActionParseError as exc:
                if strict:
                    raise
                errors.append(exc)
    elif strict:
        raise ActionParseError(f"expected text, got {type(text).__name__}")
    else:
        errors.append(ActionParseError(f"expected text, got {type(text).__name__}"))
    return calls if strict else ParsedToolCalls(calls, errors)
