"""Probe actions for checking environment programs: garbage drawn from a seed, and the actions an
environment advertises in its own observations and tool schemas.

A fixed, public list of probe actions lets a program recognise validation (and, say, win on
everything else). So the validator (and the training-time spot checks) draw their garbage from a
per-check seed: :func:`garbage_actions` gives the same actions for the same seed and inputs, and
different ones for another seed. Garbage is built to be a poor answer to any honest game: random
letter strings, numbers of seven or more digits, malformed markup, tool calls with unknown names or
ill-typed arguments. Wins by luck are therefore rare enough that a garbage win means the program
rewards something other than solving it.

:func:`advertised_actions` pulls the example actions a program prints (``\\boxed{probe 123}``,
``'pack 1 4 6'``, ``<tool_call>...</tool_call>``) out of an observation, so that a bug reachable by
an action the environment itself suggests is found when the program is checked, not in training;
:func:`mutate` turns such an example into a nearby garbage action (its numbers replaced by
out-of-range ones), and :func:`tool_probes` calls every tool a program lists, with missing and
ill-typed arguments.
"""

from __future__ import annotations

import random
import re
import string
from collections.abc import Iterable, Sequence
from typing import Any

from spadekit.envs.actions import format_tool_call

ANSWER = "<answer>done</answer>"

GAME_EDGE_PROBES = ("\\boxed{1}", "\\boxed{test}", "\\boxed{42}", "", "hello", "\\boxed{}",
                    "}{\\boxed{{", "\\boxed{" + "9" * 300 + "}")
"""Fixed edge cases every game must take without raising (empty, unbalanced, huge)."""
TOOL_EDGE_PROBES = ('<tool_call>{"name": "no_such_tool", "arguments": {}}</tool_call>',
                    "<tool_call>not json</tool_call>", "hello", "\\boxed{1}", "",
                    '<tool_call>{"name": 3}</tool_call>')
"""Fixed edge cases every tool-use program must take without raising."""

MAX_ADVERTISED = 12
"""At most this many advertised actions are kept per program."""
_MAX_EXAMPLE_CHARS = 200

_BOX_OPEN = re.compile(r"\\boxed\s*\{")
_TOOL_CALL = re.compile(r"<tool_call>.{0,%d}?</tool_call>" % _MAX_EXAMPLE_CHARS, re.DOTALL)
_ANSWER_TAG = re.compile(r"<answer>[^<>]{0,100}</answer>")
_QUOTED_COMMAND = re.compile(r"""(?<![\w])['"]([a-z][a-z_]*(?: [\w.,+-]+){1,8})['"]""")
_DIGITS = re.compile(r"[0-9]+")
_SYMBOLS = "{}[]()<>\\|/\"'`~!@#$%^&*_=+;:,.?-" + "é中\u2603\U0001f600\t\n"


def _balanced_box(text: str, start: int, end: int) -> str | None:
    """The ``\\boxed{...}`` whose opening brace ends at ``end``, or None if it never closes."""
    depth = 1
    for i in range(end, min(len(text), end + _MAX_EXAMPLE_CHARS)):
        if text[i] == "{":
            depth += 1
        elif text[i] == "}":
            depth -= 1
            if depth == 0:
                return "\\boxed{" + text[end:i] + "}"
    return None


def advertised_actions(text: str, tooluse: bool = False, limit: int = MAX_ADVERTISED
                       ) -> list[str]:
    """Example actions that an observation shows the agent, in order, without repeats.

    Found: every ``\\boxed{...}`` with balanced braces, every ``<tool_call>...</tool_call>`` and
    ``<answer>...</answer>`` block, and (games) quoted commands such as ``'inspect 1 2 3'``
    (a lowercase word and one or more arguments), sent wrapped in ``\\boxed{}``."""
    if not isinstance(text, str):
        return []
    found: list[tuple[int, str]] = []
    for m in _BOX_OPEN.finditer(text):
        box = _balanced_box(text, m.start(), m.end())
        if box is not None:
            found.append((m.start(), box))
    found += [(m.start(), m.group(0)) for m in _TOOL_CALL.finditer(text)]
    found += [(m.start(), m.group(0)) for m in _ANSWER_TAG.finditer(text)]
    if not tooluse:
        found += [(m.start(), "\\boxed{" + m.group(1) + "}")
                  for m in _QUOTED_COMMAND.finditer(text)]
    out: list[str] = []
    for _pos, action in sorted(found, key=lambda item: item[0]):
        if action not in out:
            out.append(action)
            if len(out) >= limit:
                break
    return out


def merge_advertised(known: list[str], new: Iterable[str], limit: int = MAX_ADVERTISED
                     ) -> list[str]:
    """Append the actions of ``new`` not yet in ``known`` (in place, up to ``limit``); returns
    the ones added."""
    added = []
    for action in new:
        if len(known) >= limit:
            break
        if action not in known:
            known.append(action)
            added.append(action)
    return added


def _big_number(rng: random.Random) -> str:
    n = str(rng.randrange(10 ** 6, 10 ** 12))
    return "-" + n if rng.random() < 0.25 else n


def _word(rng: random.Random) -> str:
    return "".join(rng.choice(string.ascii_lowercase) for _ in range(rng.randint(5, 9)))


def mutate(action: str, rng: random.Random) -> str | None:
    """``action`` with every number replaced by an out-of-range one (seven digits or more,
    sometimes negative), or None when it has no numbers."""
    if not _DIGITS.search(action):
        return None
    return _DIGITS.sub(lambda _m: _big_number(rng), action)


def _bad_value(rng: random.Random) -> Any:
    """An argument value of a type or size a tool is unlikely to expect (all JSON-safe)."""
    return rng.choice([_word(rng), "", -1, rng.randrange(10 ** 9, 10 ** 15), None, [], {},
                       1e300, True, [_word(rng)], {"x": _word(rng)}])


def _tool_names(schemas: Sequence[Any]) -> list[tuple[str, list[str]]]:
    """(name, parameter names) of each well-formed schema; malformed entries are skipped."""
    out = []
    for schema in schemas:
        fn = schema.get("function") if isinstance(schema, dict) else None
        name = fn.get("name") if isinstance(fn, dict) else None
        if not isinstance(name, str) or not name:
            continue
        params = fn.get("parameters")
        props = params.get("properties") if isinstance(params, dict) else None
        out.append((name, [p for p in props if isinstance(p, str)][:12]
                    if isinstance(props, dict) else []))
    return out


def tool_probes(schemas: Sequence[Any], rng: random.Random, limit: int = 16) -> list[str]:
    """For every listed tool: a call without arguments, and one with every parameter given an
    ill-typed or out-of-range value."""
    out: list[str] = []
    for name, params in _tool_names(schemas):
        out.append(format_tool_call(name, {}))
        bad = {p: _bad_value(rng) for p in params} or {_word(rng): -1}
        out.append(format_tool_call(name, bad))
        if len(out) >= limit:
            break
    return out[:limit]


def garbage_action(rng: random.Random, tooluse: bool = False, advertised: Sequence[str] = (),
                   tools: Sequence[Any] = ()) -> str:
    """One garbage action drawn from ``rng`` (see the module docstring for what it can be)."""
    kinds = ["box_word", "box_number", "box_mixed", "prose", "symbols"]
    mutable = [a for a in advertised if _DIGITS.search(a)]
    if mutable:
        kinds += ["mutated", "mutated"]
    if tooluse:
        kinds += ["unknown_tool", "bad_json", "answer"]
        if tools:
            kinds += ["known_tool", "known_tool", "known_tool"]
    kind = rng.choice(kinds)
    if kind == "box_word":
        return "\\boxed{" + _word(rng) + "}"
    if kind == "box_number":
        return "\\boxed{" + _big_number(rng) + "}"
    if kind == "box_mixed":
        parts = [_word(rng) if rng.random() < 0.5 else _big_number(rng)
                 for _ in range(rng.randint(2, 5))]
        return "\\boxed{" + " ".join(parts) + "}"
    if kind == "prose":
        return " ".join(_word(rng) for _ in range(rng.randint(1, 6)))
    if kind == "symbols":
        return "".join(rng.choice(_SYMBOLS) for _ in range(rng.randint(1, 40)))
    if kind == "mutated":
        return mutate(rng.choice(mutable), rng) or ""
    if kind == "unknown_tool":
        return format_tool_call(_word(rng), {_word(rng): _bad_value(rng)})
    if kind == "bad_json":
        return "<tool_call>{" + _word(rng) + ": " + _big_number(rng) + "</tool_call>"
    if kind == "answer":
        return ANSWER
    name, params = rng.choice(_tool_names(tools) or [(_word(rng), [])])
    return format_tool_call(name, {p: _bad_value(rng) for p in params})


def garbage_actions(seed: int, n: int, tooluse: bool = False, advertised: Sequence[str] = (),
                    tools: Sequence[Any] = ()) -> list[str]:
    """``n`` garbage actions for a program, fixed by ``seed``: the same seed, ``advertised``
    actions and tool schemas give the same list. ``tools`` are the program's ``tools()``
    schemas (tool-use programs get calls to those tools with ill-typed arguments)."""
    rng = random.Random(seed)
    return [garbage_action(rng, tooluse, advertised, tools) for _ in range(max(0, n))]
