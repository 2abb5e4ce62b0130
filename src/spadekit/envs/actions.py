"""Parsers for the two action conventions of spadekit environments.

Games: the agent wraps its command as ``\\boxed{<command>}``; the environment reads the *last*
top-level box of the turn (:func:`extract_boxed`).

Tool use: the agent emits one or more ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``
blocks (:func:`parse_tool_calls`) and finishes with ``<answer>...</answer>``
(:func:`extract_answer`). Prose around the tags is ignored.

Standard library only: sandbox workers import this module with site-packages disabled.
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
_FENCE = re.compile(r"^```[A-Za-z]*\s*(.*?)\s*```$", re.DOTALL)


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
        depth, start = 1, match.end()
        i = start
        while i < len(text) and depth:
            ch = text[i]
            if ch == "{":
                depth += 1
            elif ch == "}":
                depth -= 1
            i += 1
        if depth:
            return None  # unclosed box: the turn's command cannot be trusted
        result = text[start : i - 1].strip()
        pos = i


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


def _parse_one(body: str, index: int) -> ToolCall:
    """Parse the JSON body of one ``<tool_call>`` block; raise ActionParseError if malformed."""
    snippet = body.strip()[:120]
    text = body.strip()
    fenced = _FENCE.match(text)
    if fenced:  # tolerate a ```json ... ``` fence inside the tag
        text = fenced.group(1)
    if not text:
        raise ActionParseError(f"tool call #{index + 1} is empty", index=index, snippet=snippet)
    try:
        payload = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ActionParseError(
            f"tool call #{index + 1} is not valid JSON ({exc.msg} at char {exc.pos})",
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
            arguments = json.loads(arguments) if arguments.strip() else {}
        except json.JSONDecodeError:
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
    """Parse every ``<tool_call>...</tool_call>`` block in ``text``, in order.

    Each block holds a JSON object ``{"name": str, "arguments": object}`` (whitespace and newlines
    allowed; ``arguments`` may be omitted, or given as a JSON string encoding an object). A block
    whose closing tag is missing runs to the next ``<tool_call>`` or to the end of the text.

    With ``strict=True`` (default) return the list of calls and raise :class:`ActionParseError`
    on the first malformed block. With ``strict=False`` never raise: return
    ``ParsedToolCalls(calls, errors)`` holding the valid calls and one error per malformed block.
    Text without any block gives ``[]`` (or ``ParsedToolCalls([], [])``).

    ``limit`` caps how many blocks are read (valid or not); later blocks are ignored, which keeps
    a turn holding thousands of calls cheap to handle.
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
