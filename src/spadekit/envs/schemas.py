"""Tool schemas in the shapes programs write them, and reference-style string solutions.

:func:`normalize_tools` turns nested OpenAI schemas, flat ``{"name", "description",
"parameters"}`` schemas and the SPADE reference's ``_tools`` dict into the nested OpenAI shape;
anything else raises :class:`SchemaError` naming the program and the schema.
:func:`solution_actions` turns a ``solution()`` string made of tool calls, ``\\boxed{...}``
commands and an answer into the actions that replay it, ``None`` when it is not replayable. The
string is untrusted, so reading it is linear and capped: over a cap raises
``InvalidResult(reason="oversized")``, past its budget ``InvalidResult(reason="parent_budget")``
(:mod:`spadekit.envs.scan_limits`). Standard library only.
"""

import json
import re

from spadekit.envs.scan_limits import Deadline, oversized, parent_work

__all__ = ["MAX_JSON_DEPTH", "MAX_SOLUTION_ACTIONS", "MAX_SOLUTION_CHARS", "SchemaError",
           "normalize_tools", "shape_of", "solution_actions", "tool_names"]

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


# -- string solutions -----------------------------------------------------------------------

#: A string solution longer than this is refused (``oversized``) before it is read.
MAX_SOLUTION_CHARS = 100_000
#: At most this many actions in one string solution (more: ``oversized``).
MAX_SOLUTION_ACTIONS = 1_000
#: A ``<tool_call>`` body nested deeper than this (arrays and objects) is ``oversized``.
MAX_JSON_DEPTH = 64
#: Bracket scanning and parsing may cover this many characters per character of the solution
#: (an honest one needs about one); past it the read stops with ``parent_budget``.
SCAN_WORK_FACTOR = 8

_OPENING = re.compile(r"<tool_call>|<answer>|\\boxed\{|\bANSWER\s*:\s*([^\n]*)"
                      r"|\b([A-Za-z_][A-Za-z0-9_]*)\s*\(")
_PAREN_TOKENS = re.compile(r"[()'\"\\]")
_BRACE_TOKENS = re.compile(r"[{}]")
_JSON_STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"?', re.DOTALL)
_NOT_BRACKETS = {ord(c): None for c in map(chr, range(128)) if c not in "[]{}"}
_CHECK_EVERY = 4096  # bracket tokens between two looks at the deadline


class _Reader:
    """The bracket scans of one solution string: each scan is recorded for every bracket it
    passes, so a bracket is scanned from at most once for all the openings that need it, and
    all of them share one work budget and one deadline."""

    def __init__(self, text, deadline):
        self.text = text
        self.deadline = deadline
        self.closes = {}  # index of a "(" -> index past its ")", or None (never closes)
        self.work = 0
        self.limit = SCAN_WORK_FACTOR * len(text) + 4096

    def charge(self, chars):
        self.work += chars
        if self.work > self.limit:
            raise self.deadline.exhausted("work")
        self.deadline.check()

    def brace_end(self, start):
        """Index just past the ``}`` closing the ``{`` before ``start``, or None."""
        depth = 0
        for count, match in enumerate(_BRACE_TOKENS.finditer(self.text, start)):
            depth += 1 if match.group() == "{" else -1
            if depth < 0:
                self.charge(match.end() - start)
                return match.end()
            if count % _CHECK_EVERY == _CHECK_EVERY - 1:
                self.deadline.check()
        self.charge(len(self.text) - start)
        return None

    def paren_end(self, opening):
        """Index just past the ``)`` closing the ``(`` at ``opening``, quotes respected (a
        backslash inside quotes escapes the next character), or None."""
        if opening in self.closes:
            return self.closes[opening]
        stack, quote, skip = [opening], None, -1
        for count, match in enumerate(_PAREN_TOKENS.finditer(self.text, opening + 1)):
            at, ch = match.start(), match.group()
            if count % _CHECK_EVERY == _CHECK_EVERY - 1:
                self.deadline.check()
            if at < skip:
                continue
            if quote:
                if ch == "\\":
                    skip = at + 2
                elif ch == quote:
                    quote = None
            elif ch == "'" or ch == '"':
                quote = ch
            elif ch == "(":
                stack.append(at)
            elif ch == ")":
                self.closes[stack.pop()] = at + 1
                if not stack:
                    self.charge(at + 1 - opening)
                    return at + 1
        for at in stack:
            self.closes[at] = None
        self.charge(len(self.text) - opening)
        return None


def _too_deep(body, limit=MAX_JSON_DEPTH):
    """Whether the JSON text ``body`` nests arrays/objects deeper than ``limit`` (strings
    skipped; one pass)."""
    brackets = _JSON_STRING.sub("", body).translate(_NOT_BRACKETS)
    if len(brackets) <= 2 * limit:
        return False
    depth = 0
    for ch in brackets:
        depth += 1 if ch in "[{" else -1
        if depth > limit:
            return True
    return False


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
    except (TypeError, ValueError, RecursionError):
        return None


def _tool_call(body):
    """The parsed ``<tool_call>`` body, None when it is no call; ``oversized`` when too deep."""
    if _too_deep(body):
        raise oversized("solution() has a <tool_call> nested deeper than %d levels"
                        % MAX_JSON_DEPTH)
    try:
        parsed = json.loads(body)
    except RecursionError:
        raise oversized("solution() has a <tool_call> nested too deep to read") from None
    except ValueError:
        return None
    return parsed if isinstance(parsed, dict) and isinstance(parsed.get("name"), str) else None


def solution_actions(text, tools=(), budget_s=None):
    """The actions that replay a string solution, or ``None``; ``tools`` are the program's nested
    schemas. Raises ``InvalidResult(reason="oversized")`` over :data:`MAX_SOLUTION_CHARS`,
    :data:`MAX_SOLUTION_ACTIONS` or :data:`MAX_JSON_DEPTH`, and ``reason="parent_budget"`` past
    :data:`SCAN_WORK_FACTOR` times its length in scanning or ``budget_s`` seconds.
    """
    if not isinstance(text, str):
        return None
    if len(text) > MAX_SOLUTION_CHARS:
        raise oversized("solution() returned a string of %d characters (limit %d)"
                        % (len(text), MAX_SOLUTION_CHARS))
    with parent_work():
        return _read_solution(text, tools, Deadline("solution()", budget_s))


def _read_solution(text, tools, deadline):
    params = {}
    for schema in tools or ():
        fn = schema.get("function", {}) if isinstance(schema, dict) else {}
        props = (fn.get("parameters") or {}).get("properties") or {}
        if isinstance(fn.get("name"), str):
            params[fn["name"]] = list(props)
    reader = _Reader(text, deadline)
    closing = {"<tool_call>": ["</tool_call>", -2], "<answer>": ["</answer>", -2]}
    actions, pos, answered = [], 0, False
    while True:
        match = _OPENING.search(text, pos)
        if match is None:
            break
        deadline.check()
        if len(actions) > MAX_SOLUTION_ACTIONS:
            raise oversized("solution() holds more than %d actions" % MAX_SOLUTION_ACTIONS)
        pos = match.end()
        opening, tail, name = match.group(0), match.group(1), match.group(2)
        if opening in closing:
            tag, found = closing[opening]  # the first closing tag at or after pos (cached)
            if found != -1 and found < pos:
                found = closing[opening][1] = text.find(tag, pos)
            if found == -1:  # unclosed: prose, as a regex search would skip it
                pos = match.start() + 1
                continue
            body = text[pos:found]
            pos = found + len(tag)
            if opening == "<answer>":
                actions.append("<answer>%s</answer>" % body.strip())
                answered = True
                continue
            reader.charge(len(body))
            if _tool_call(body) is None:
                return None
            actions.append(text[match.start():pos])
        elif tail is not None:
            actions.append("<answer>%s</answer>" % tail.strip())
            answered = True
        elif name is None:  # \boxed{
            end = reader.brace_end(pos)
            if end is None:
                return None
            actions.append(text[match.start():end])
            pos = end
        elif name in params:
            end = reader.paren_end(pos - 1)
            if end is not None:
                reader.charge(end - match.start(2))
                action = _call_action(text[match.start(2):end], name, params[name])
                if action is not None:
                    actions.append(action)
                    pos = end
    if len(actions) > MAX_SOLUTION_ACTIONS:
        raise oversized("solution() holds more than %d actions" % MAX_SOLUTION_ACTIONS)
    if not actions:
        return None
    if params and not answered:
        return None
    return actions
