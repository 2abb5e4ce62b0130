"""Tool schemas in the shapes programs write them, and reference-style string solutions.

:func:`normalize_tools` accepts what models and frameworks write and returns one shape, the
nested OpenAI ``[{"type": "function", "function": {"name", "description", "parameters"}}]``:

- nested schemas (as above);
- flat schemas ``{"name", "description", "parameters"}`` (a ``"type": "function"`` beside them
  is allowed);
- the SPADE reference's ``_tools`` dict ``{name: {"description", "parameters"}}``.

``parameters`` defaults to an empty object schema; one with ``properties`` but no ``type`` is
taken as an object. Anything else raises :class:`SchemaError`, whose message names the
program and the schema (its position and name, when it has one).

:func:`solution_actions` turns a reference-style ``solution()`` string into the actions that
replay it, when the string is made of tool calls and an answer: ``<tool_call>`` blocks,
calls written as ``name(key="value", ...)`` with a listed tool's name and literal arguments,
``<answer>...</answer>`` or a trailing ``ANSWER: ...``, and ``\\boxed{...}`` commands, in the
order they appear (prose between them is ignored). It returns ``None`` for anything else (a
description, a bare value): such a solution is "not replayable".

Standard library only (sandbox workers import ``spadekit.envs``).
"""

import json
import re

__all__ = ["SchemaError", "normalize_tools", "shape_of", "solution_actions", "tool_names"]

_EMPTY = {"type": "object", "properties": {}}


class SchemaError(ValueError):
    """A tool schema that is neither nested, flat nor a reference ``_tools`` entry."""


def _short(value, limit=120):
    try:
        text = json.dumps(value, default=repr)
    except (TypeError, ValueError, RecursionError):
        text = repr(value)
    return text if len(text) <= limit else text[:limit - 3] + "..."


def shape_of(value):
    """``"nested"``, ``"flat"``, ``"dict"`` (reference ``_tools``), ``"mixed"`` or ``None``
    (empty / not a schema collection)."""
    if isinstance(value, dict):
        return "dict" if value else None
    if not isinstance(value, (list, tuple)) or not value:
        return None
    kinds = {("nested" if isinstance(s, dict) and isinstance(s.get("function"), dict)
              else "flat") for s in value}
    return kinds.pop() if len(kinds) == 1 else "mixed"


def _parameters(params, fail):
    if params is None:
        return dict(_EMPTY)
    if not isinstance(params, dict):
        fail("parameters must be a JSON schema of type object, got %s" % type(params).__name__)
    params = dict(params)
    if "type" not in params and isinstance(params.get("properties", {}), dict):
        params["type"] = "object"
    if params.get("type") != "object":
        fail("parameters must be a JSON schema of type object, got type %s"
             % _short(params.get("type")))
    if not isinstance(params.setdefault("properties", {}), dict):
        fail("parameters.properties must be an object")
    required = params.get("required", [])
    if not isinstance(required, list) or not all(isinstance(r, str) for r in required):
        fail("parameters.required must be a list of names")
    return params


def normalize_tools(value, where="the program"):
    """Nested OpenAI schemas of ``value`` (see the module docstring); ``where`` names the
    program in errors."""
    if isinstance(value, dict) and ("function" in value or isinstance(value.get("name"), str)):
        raise SchemaError("%s: tools() must return a list of schema dicts (or a {name: schema} "
                          "dict), got a single schema: %s" % (where, _short(value)))
    if isinstance(value, dict):
        items = []
        for name, entry in value.items():
            if not isinstance(entry, dict):
                raise SchemaError("%s: tool schema %r is not an object of description and "
                                  "parameters: %s" % (where, name, _short(entry)))
            inner = entry.get("function") if isinstance(entry.get("function"), dict) else entry
            items.append({"type": "function",
                          "function": dict(inner, name=inner.get("name", name))})
    elif isinstance(value, (list, tuple)):
        items = list(value)
    else:
        raise SchemaError("%s: tools must be a list of schemas or a {name: schema} dict, got %s"
                          % (where, type(value).__name__))
    out, seen = [], set()
    for index, schema in enumerate(items):
        label = "tool schema %d" % index

        def fail(problem, label=label):
            raise SchemaError("%s: %s is not {'type': 'function', 'function': {...}} (nested) "
                              "nor {'name', 'description', 'parameters'} (flat): %s"
                              % (where, label, problem))

        if not isinstance(schema, dict):
            fail("got %s" % _short(schema))
        fn = schema.get("function")
        if isinstance(fn, dict):
            if schema.get("type") != "function":
                fail("'type' must be 'function', got %s" % _short(schema.get("type")))
        elif "function" in schema:
            fail("'function' must be an object, got %s" % _short(fn))
        else:
            fn = schema
        name = fn.get("name")
        if not (isinstance(name, str) and name):
            fail("no tool name in %s" % _short(schema))

        def bad(problem, name=name, index=index):
            raise SchemaError("%s: tool schema %d, tool %r: %s" % (where, index, name, problem))

        if name in seen:
            bad("a second tool of that name")
        seen.add(name)
        description = fn.get("description", "")
        if not isinstance(description, str):
            bad("'description' must be a string")
        parameters = _parameters(fn.get("parameters"), bad)
        out.append({"type": "function", "function": {"name": name,
                                                     "description": description or name,
                                                     "parameters": parameters}})
    return out


def tool_names(value):
    """Tool names of any accepted shape (best effort, never raises)."""
    try:
        return [s["function"]["name"] for s in normalize_tools(value)]
    except SchemaError:
        return []


# ---------------------------------------------------------------------------------------------
# string solutions

_BLOCK = re.compile(r"<tool_call>(.*?)</tool_call>|<answer>(.*?)</answer>|\\boxed\{"
                    r"|\bANSWER\s*:\s*([^\n]*)|\b([A-Za-z_][A-Za-z0-9_]*)\s*\(",
                    re.DOTALL)


def _balanced(text, start, opening, closing):
    """Index just past the bracket closing the one before ``start`` (quotes respected)."""
    depth, i, quote = 1, start, None
    while i < len(text):
        ch = text[i]
        if quote:
            if ch == "\\":
                i += 1
            elif ch == quote:
                quote = None
        elif ch in "'\"" and opening == "(":
            quote = ch
        elif ch == opening:
            depth += 1
        elif ch == closing:
            depth -= 1
            if depth == 0:
                return i + 1
        i += 1
    return None


def _call_action(source, name, params):
    """``<tool_call>`` text of ``name(args)`` written as Python, or None."""
    import ast

    try:
        node = ast.parse(source, mode="eval").body
        if not isinstance(node, ast.Call):
            return None
        arguments = {}
        for position, arg in enumerate(node.args):
            if position >= len(params):
                return None
            arguments[params[position]] = ast.literal_eval(arg)
        for keyword in node.keywords:
            if keyword.arg is None:
                return None
            arguments[keyword.arg] = ast.literal_eval(keyword.value)
    except (SyntaxError, ValueError, TypeError, RecursionError, MemoryError):
        return None
    try:
        return "<tool_call>%s</tool_call>" % json.dumps({"name": name, "arguments": arguments})
    except (TypeError, ValueError):
        return None


def solution_actions(text, tools=()):
    """The actions that replay a string solution, or ``None`` (see the module docstring).
    ``tools`` are the program's nested schemas (for call notation and positional arguments)."""
    if not isinstance(text, str) or len(text) > 100_000:
        return None
    params = {}
    for schema in tools or ():
        fn = schema.get("function", {}) if isinstance(schema, dict) else {}
        props = (fn.get("parameters") or {}).get("properties") or {}
        if isinstance(fn.get("name"), str):
            params[fn["name"]] = list(props)
    actions, pos, answered = [], 0, False
    while True:
        match = _BLOCK.search(text, pos)
        if match is None:
            break
        pos = match.end()
        call, answer, tail, name = match.group(1), match.group(2), match.group(3), \
            match.group(4)
        if call is not None:
            try:
                parsed = json.loads(call)
            except ValueError:
                return None
            if not isinstance(parsed, dict) or not isinstance(parsed.get("name"), str):
                return None
            actions.append(match.group(0))
        elif answer is not None or tail is not None:
            value = (answer if answer is not None else tail).strip()
            actions.append("<answer>%s</answer>" % value)
            answered = True
        elif name is None:  # \boxed{
            end = _balanced(text, pos, "{", "}")
            if end is None:
                return None
            actions.append(text[match.start():end])
            pos = end
        elif name in params:
            end = _balanced(text, pos, "(", ")")
            action = None if end is None else _call_action(
                text[match.start(4):end], name, params[name])
            if action is not None:
                actions.append(action)
                pos = end
    if not actions:
        return None
    if params and not answered:
        return None
    return actions
