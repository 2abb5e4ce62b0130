"""Unit tests for spadekit.envs.actions."""

from __future__ import annotations

import dataclasses
import json

import pytest

from spadekit.envs.actions import (
    ActionParseError,
    ParsedToolCalls,
    ToolCall,
    boxed,
    extract_answer,
    extract_boxed,
    format_tool_call,
    parse_tool_calls,
)


# ----- boxed -----------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("\\boxed{move 3}", "move 3"),
        ("I think... \\boxed{ guess 12 } because", "guess 12"),
        ("\\boxed{a} then \\boxed{b}", "b"),
        ("\\boxed{f(x) = {1, {2}}}", "f(x) = {1, {2}}"),
        ("\\boxed{\\boxed{inner}}", "\\boxed{inner}"),
        ("\\boxed{}", ""),
        ("\\boxed {spaced}", "spaced"),
        ("prefix \\boxed{x}} trailing brace", "x"),
    ],
)
def test_extract_boxed(text, expected):
    assert extract_boxed(text) == expected


@pytest.mark.parametrize(
    "text", ["", "hello", "boxed{x}", "\\boxed{unclosed", "\\boxed{a} \\boxed{b {c}", "\\boxed x"]
)
def test_extract_boxed_absent_or_unbalanced(text):
    assert extract_boxed(text) is None


def test_extract_boxed_non_string_and_huge():
    assert extract_boxed(None) is None  # type: ignore[arg-type]
    assert extract_boxed(12) is None  # type: ignore[arg-type]
    big = "x" * 200_000 + "\\boxed{" + "{}" * 50_000 + "}"
    assert extract_boxed(big) == "{}" * 50_000


@pytest.mark.parametrize("command", ["move 3", "f(x) = {1}", "", "a } b {"])
def test_boxed_roundtrip(command):
    assert boxed(command) == "\\boxed{" + command + "}"
    if command.count("{") == command.count("}") and "} b {" not in command:
        assert extract_boxed(boxed(command)) == command.strip()


# ----- answer ----------------------------------------------------------------------------------
def test_extract_answer():
    assert extract_answer("so <answer> done </answer>") == "done"
    assert extract_answer("<answer>1</answer> and <ANSWER>two\nlines</ANSWER>") == "two\nlines"
    assert extract_answer("<answer></answer>") == ""
    assert extract_answer("no tags") is None
    assert extract_answer("<answer>unclosed") is None
    assert extract_answer(None) is None  # type: ignore[arg-type]


# ----- tool calls ------------------------------------------------------------------------------
def test_tool_call_is_frozen_dataclass():
    call = ToolCall("search", {"q": "x"})
    assert dataclasses.is_dataclass(call)
    with pytest.raises(dataclasses.FrozenInstanceError):
        call.name = "other"  # type: ignore[misc]
    assert ToolCall("f").arguments == {}


def test_parse_single_and_multiple_calls_with_prose():
    text = (
        'Let me look.\n<tool_call>{"name": "search", "arguments": {"q": "cats"}}</tool_call>\n'
        'and then\n<tool_call>\n{\n  "name": "get",\n  "arguments": {"id": 3, "tags": ["a"]}\n}\n'
        "</tool_call> trailing words"
    )
    assert parse_tool_calls(text) == [
        ToolCall("search", {"q": "cats"}),
        ToolCall("get", {"id": 3, "tags": ["a"]}),
    ]


def test_parse_lenient_forms():
    assert parse_tool_calls('<tool_call>{"name": "ping"}</tool_call>') == [ToolCall("ping", {})]
    null_args = '<tool_call>{"name": "f", "arguments": null}</tool_call>'
    assert parse_tool_calls(null_args) == [ToolCall("f", {})]
    as_string = json.dumps({"name": "f", "arguments": json.dumps({"x": 1})})
    assert parse_tool_calls(f"<tool_call>{as_string}</tool_call>") == [ToolCall("f", {"x": 1})]
    fenced = '<tool_call>\n```json\n{"name": "f", "arguments": {"x": 2}}\n```\n</tool_call>'
    assert parse_tool_calls(fenced) == [ToolCall("f", {"x": 2})]
    unclosed = '<tool_call>{"name": "a", "arguments": {}}<tool_call>{"name": "b", "arguments": {}}'
    assert [c.name for c in parse_tool_calls(unclosed)] == ["a", "b"]
    assert parse_tool_calls('<TOOL_CALL>{"name": "up"}</TOOL_CALL>') == [ToolCall("up", {})]


def test_parse_no_calls():
    assert parse_tool_calls("just prose") == []
    assert parse_tool_calls("just prose", strict=False) == ParsedToolCalls([], [])


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ("{not json}", "not valid JSON"),
        ("", "empty"),
        ("[1, 2]", "JSON object"),
        ('{"arguments": {}}', "name"),
        ('{"name": 5}', "name"),
        ('{"name": "  "}', "name"),
        ('{"name": "f", "arguments": [1]}', "must be a JSON object, got list"),
        ('{"name": "f", "arguments": "x"}', "must be a JSON object, got str"),
        ('{"name": "f", "arguments": 3}', "got int"),
    ],
)
def test_parse_malformed_strict_raises(body, message):
    with pytest.raises(ActionParseError, match=message) as info:
        parse_tool_calls(f"<tool_call>{body}</tool_call>")
    assert isinstance(info.value, ValueError)
    assert info.value.index == 0


def test_parse_non_strict_collects_errors_in_order():
    text = (
        '<tool_call>{"name": "ok1", "arguments": {}}</tool_call>'
        "<tool_call>{broken</tool_call>"
        '<tool_call>{"name": "ok2", "arguments": {"a": 1}}</tool_call>'
        '<tool_call>{"name": "bad", "arguments": [1]}</tool_call>'
    )
    calls, errors = parse_tool_calls(text, strict=False)
    assert calls == [ToolCall("ok1", {}), ToolCall("ok2", {"a": 1})]
    assert [e.index for e in errors] == [1, 3]
    assert all(isinstance(e, ActionParseError) for e in errors)
    assert "tool call #2" in str(errors[0]) and errors[0].snippet.startswith("{broken")
    with pytest.raises(ActionParseError, match="#2"):
        parse_tool_calls(text)


def test_parse_limit():
    text = format_tool_call("a") + "<tool_call>{bad}</tool_call>" + format_tool_call("b") * 50
    assert parse_tool_calls(text, limit=1) == [ToolCall("a", {})]
    calls, errors = parse_tool_calls(text, strict=False, limit=3)
    assert [c.name for c in calls] == ["a", "b"] and len(errors) == 1
    assert len(parse_tool_calls(text, strict=False).calls) == 51


def test_parse_non_string_input():
    with pytest.raises(ActionParseError):
        parse_tool_calls(None)  # type: ignore[arg-type]
    calls, errors = parse_tool_calls(None, strict=False)  # type: ignore[arg-type]
    assert calls == [] and len(errors) == 1


@pytest.mark.parametrize(
    "arguments",
    [
        {},
        {"x": 1},
        {"text": "quote \" and </tool_call><tool_call> inside"},
        {"nested": {"a": [1, {"b": None}]}},
        {"u": "ünï"},
    ],
)
def test_format_parse_roundtrip(arguments):
    text = format_tool_call("tool_x", arguments)
    assert text.startswith("<tool_call>") and text.endswith("</tool_call>")
    assert parse_tool_calls("prose " + text + " prose") == [ToolCall("tool_x", arguments)]


def test_format_tool_call_defaults():
    assert parse_tool_calls(format_tool_call("f")) == [ToolCall("f", {})]
