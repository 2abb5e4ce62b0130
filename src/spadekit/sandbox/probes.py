"""Probe actions for checking environment programs: garbage drawn from a seed, and the actions an
environment advertises in its own observations and tool schemas.

:func:`garbage_actions` gives the same actions for the same seed and inputs and other ones for
another seed, drawn from a broad mix (model-like replies, :func:`model_reply`; advertised and
solution actions mutated; random strings, numbers, symbols, broken markup; for tool use random
answers, calls with plausibly typed arguments, unknown tools, broken JSON), so a program cannot
recognise validation. :func:`random_policy_actions` is the second baseline (never a solution
action unchanged). :func:`advertised_actions` pulls the example actions out of an observation,
:func:`mutate` turns one into a nearby garbage action, :func:`tool_probes` calls every listed
tool with missing and ill-typed arguments. The mix in detail: docs/design/sandbox.md.
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


COMMON_WORDS = ("next", "yes", "no", "done", "ok", "start", "go", "help", "hint", "skip",
                "pass", "stop", "continue", "left", "right", "up", "down", "north", "south",
                "east", "west", "true", "false", "a", "b", "c", "d", "A", "B", "none", "all",
                "submit", "answer", "check", "look", "wait", "open", "solve", "guess", "undo",
                "quit", "list", "show", "again", "unknown", "maybe", "correct", "finish", "x",
                "red", "blue", "first", "last", "zero", "one", "two", "three")
"""Short answers a model gives (and a program paying for "anything else" would reward)."""
VERBS = ("move", "go", "take", "open", "check", "guess", "submit", "answer", "set", "add",
         "remove", "swap", "pick", "select", "query", "ask", "flip", "toggle", "push", "place",
         "mark", "choose", "inspect", "use", "look", "buy", "sell", "read", "send", "get")
_SENTENCES = ("I think the answer is {n}.", "Let me try {w}.", "The answer is \\boxed{{{w}}}.",
              "I'm not sure, maybe {w}?", "First I will {v} {n}, then {v} {m}.",
              "Final answer: {n}", "Let's {v} {n} and see what happens.",
              "So the result should be \\boxed{{{n}}}.", "{V} {n}", "I will {v} the {w} one.",
              "I don't know.", "Based on the clues, it must be {w}.", "{n}", "{w} {n} {m}")
_ANSWERS = ("", "no idea", "yes", "no", "completed", "The task is complete.", "I don't know",
            "{n}", "{w}", "{V} {n}", "success", "all done", "finished: {w}", "DONE", "done.")
MAX_GARBAGE_CHARS = 1500
"""Drawn garbage (mutations aside) is at most this long (what a model's reply of the rollout's
default ``max_new_tokens`` reaches); a mutation at most its original + 40."""
PROSE_WORDS = ("the", "a", "is", "it", "to", "of", "and", "that", "this", "I", "we", "so",
               "try", "will", "should", "can", "next", "number", "answer", "game", "move",
               "value", "clue", "result", "step", "first", "then", "now", "because", "since",
               "if", "not", "must", "be", "more", "less", "than", "higher", "lower", "range",
               "between", "correct", "wrong", "guess", "start", "middle", "left", "right",
               "look", "see", "know", "think", "seems", "likely", "best", "option", "check")
"""Common words the prose of a model-like garbage reply is made of."""
_REASONING = ("Let me think about this step by step.", "First, I need to understand the rules.",
              "Looking at the observation carefully,", "Based on the feedback so far,",
              "That did not work, so I should try something else.", "Wait, let me reconsider.",
              "The best move now seems to be the following.", "To solve this, I will",
              "Let me work through the options one by one.", "My reasoning is as follows.",
              "Okay, so the goal is clear.", "Therefore, my answer is", "Hmm, interesting.",
              "I will narrow it down from here.", "So the next step is")
"""Reasoning-like sentences models write before their answer."""
_WORD = re.compile(r"[A-Za-z][A-Za-z']*|[0-9]+")


def _small(rng: random.Random) -> int:
    return rng.choice((rng.randint(0, 10), rng.randint(0, 20), rng.randint(1, 100),
                       rng.randint(-5, 5), rng.randint(100, 999)))


def _fill(template: str, rng: random.Random, verbs: Sequence[str]) -> str:
    verb = rng.choice(verbs)
    return template.format(n=_small(rng), m=_small(rng), w=rng.choice(COMMON_WORDS), v=verb,
                           V=verb.capitalize())


def _verbs(advertised: Sequence[str]) -> list[str]:
    """The command words of the advertised actions (``\\boxed{probe 12}`` -> ``probe``)."""
    out = []
    for action in advertised:
        inner = action[len("\\boxed{"):-1] if action.startswith("\\boxed{") else ""
        word = inner.split(" ", 1)[0] if inner else ""
        if word.isidentifier() and len(word) <= 30 and word not in out:
            out.append(word)
    return out


def _redraw(digits: str, rng: random.Random) -> str:
    """Another number of as many digits (no leading zero unless one digit)."""
    width = min(len(digits), 18)
    low = 0 if width == 1 else 10 ** (width - 1)
    value = str(rng.randrange(low, 10 ** width))
    return value if value != digits else str(rng.randrange(low, 10 ** width))


def _shift(action: str, rng: random.Random, near: bool = True) -> str:
    """``action`` with one of its numbers (or each, half the time) moved by 1 to 3, up or down
    (``near``), or redrawn with as many digits; without numbers, one character changed, dropped
    or doubled. Never ``action`` itself."""
    runs = list(_DIGITS.finditer(action))
    if runs:
        every = rng.random() < 0.5
        pick = rng.randrange(len(runs))

        def moved(m: re.Match) -> str:
            if not every and m.start() != runs[pick].start():
                return m.group(0)
            if not near:
                return _redraw(m.group(0), rng)
            value = int(m.group(0)[:18]) + rng.choice((-3, -2, -1, 1, 2, 3))
            return str(abs(value) if value < 0 else value)

        out = _DIGITS.sub(moved, action)
        if out != action:
            return out
    if not action:
        return rng.choice(COMMON_WORDS)
    lo, hi = 0, len(action)  # inside the \\boxed{...} where there is one: the markup stays
    box = _BOX_OPEN.search(action)
    if box is not None and action.endswith("}") and box.end() < len(action) - 1:
        lo, hi = box.end(), len(action) - 1
    i = rng.randrange(lo, hi)
    how = rng.randrange(3)
    if how == 0:
        repl = rng.choice(string.ascii_lowercase.replace(action[i].lower(), "") or "z")
        out = action[:i] + repl + action[i + 1:]
    elif how == 1:
        out = action[:i] + action[i + 1:]
    else:
        out = action[:i] + action[i] + action[i:]
    return out if out != action else action + "x"


def mutate_action(action: str, rng: random.Random, near: bool = True) -> str:
    """A wrong version of one action: numbers shifted (``near``) or redrawn, a character
    changed, or cut short (see ``_shift``); at most ``len(action) + 40`` characters, never
    ``action``."""
    if len(action) > 4 and rng.random() < 0.2:
        out = action[:rng.randrange(1, len(action))]
    else:
        out = _shift(action, rng, near)
    out = out[:len(action) + 40]
    return out if out != action else action[:-1]


def mutate_solution(solution: Sequence[str], rng: random.Random) -> list[str]:
    """The solution sequence made wrong in one place: one action's numbers shifted (or a
    character changed), two neighbours swapped, one repeated in place of the next, or the last
    dropped. Never equal to ``solution`` (a swap of equal neighbours falls back to a shift)."""
    sol = list(solution)
    if not sol:
        return []
    kinds = ["shift", "shift"] + (["swap", "repeat"] if len(sol) > 1 else []) + ["drop"]
    kind = rng.choice(kinds)
    i = rng.randrange(len(sol))
    if kind == "swap" and sol[i - 1] != sol[i] and i > 0:
        sol[i - 1], sol[i] = sol[i], sol[i - 1]
    elif kind == "repeat" and i > 0 and sol[i - 1] != sol[i]:
        sol[i] = sol[i - 1]
    elif kind == "drop":
        sol = sol[:-1]
    else:
        sol[i] = mutate_action(sol[i], rng)
    return sol


def _plain_value(spec: Any, rng: random.Random) -> Any:
    """A plausibly typed argument for a JSON-schema property (all JSON-safe)."""
    spec = spec if isinstance(spec, dict) else {}
    enum = spec.get("enum")
    if isinstance(enum, list) and enum and rng.random() < 0.7:
        return rng.choice(enum)
    kind = spec.get("type")
    if kind == "integer":
        return _small(rng)
    if kind == "number":
        return round(rng.uniform(-10, 1000), rng.choice((0, 1, 2)))
    if kind == "boolean":
        return rng.random() < 0.5
    if kind == "array":
        return [_plain_value(spec.get("items"), rng) for _ in range(rng.randint(0, 3))]
    if kind == "object":
        return {}
    return rng.choice((rng.choice(COMMON_WORDS), f"{rng.choice(string.ascii_uppercase)}"
                       f"{_small(rng)}", f"{rng.choice(COMMON_WORDS)}_{rng.randint(1, 99)}",
                       str(_small(rng))))


def _typed_tool_call(tools: Sequence[Any], rng: random.Random) -> str:
    named = []
    for schema in tools:
        fn = schema.get("function") if isinstance(schema, dict) else None
        params = fn.get("parameters") if isinstance(fn, dict) else None
        props = params.get("properties") if isinstance(params, dict) else None
        if isinstance(fn, dict) and isinstance(fn.get("name"), str) and fn["name"]:
            named.append((fn["name"], props if isinstance(props, dict) else {}))
    if not named:
        return format_tool_call(rng.choice(VERBS), {})
    name, props = rng.choice(named)
    keys = [k for k in props if isinstance(k, str)][:12]
    chosen = [k for k in keys if rng.random() < 0.85]
    return format_tool_call(name, {k: _plain_value(props[k], rng) for k in chosen})


def words_of(text: Any, limit: int = 200) -> list[str]:
    """The words and numbers of ``text`` (an observation, a hint), markup left out, at most
    ``limit``: what a model-like garbage reply may echo."""
    return _WORD.findall(text)[:limit] if isinstance(text, str) else []


def _echo(rng: random.Random, words: Sequence[str]) -> str:
    """A run of consecutive ``words`` (the whole of them half the time when there are 20 or
    fewer), as a sentence."""
    if len(words) <= 20 and rng.random() < 0.5:
        run = list(words)
    else:
        size = rng.randint(min(2, len(words)), min(len(words), 12))
        start = rng.randrange(len(words) - size + 1)
        run = list(words[start:start + size])
    return " ".join(run) + rng.choice((".", ",", ":", ""))


def model_prose(rng: random.Random, echo: Sequence[str] = (), hint: Sequence[str] = ()) -> str:
    """Prose of the length and look of what a model writes before its answer: 0 to about 80
    words in sentences of common words, sometimes reasoning-like phrases, sometimes a run of
    the words of ``echo`` (an observation) or of ``hint`` (the program's hint)."""
    target = rng.choice((0, rng.randint(1, 8), rng.randint(6, 30), rng.randint(20, 80)))
    parts: list[str] = []
    count = 0
    while count < target:
        pick = rng.random()
        if hint and pick < 0.3:
            sentence = _echo(rng, hint)
        elif echo and pick < 0.45:
            sentence = _echo(rng, echo)
        elif pick < 0.65:
            sentence = rng.choice(_REASONING)
        else:
            words = [rng.choice(PROSE_WORDS) for _ in range(rng.randint(3, 14))]
            sentence = " ".join(words).capitalize() + rng.choice((".", ".", ",", "?", "!"))
        parts.append(sentence)
        count += len(sentence.split())
    return " ".join(parts)


def model_reply(rng: random.Random, tooluse: bool = False, advertised: Sequence[str] = (),
                tools: Sequence[Any] = (), echo: Sequence[str] = (),
                hint: Sequence[str] = ()) -> str:
    """A garbage reply shaped like a model's: :func:`model_prose` then, on a new line or not,
    a short garbage action (a boxed command, word or number; for tool use an answer or a tool
    call); at most ``MAX_GARBAGE_CHARS`` characters, the action kept whole."""
    verbs = _verbs(advertised) + list(VERBS)
    if tooluse:
        tail = rng.choice(["answer", "typed_tool" if tools else "answer", "unknown_tool"])
    else:
        tail = rng.choice(["command", "command", "word", "number"]
                          + (["advertised"] if advertised else []))
    action = _garbage_kind(tail, rng, tooluse, advertised, tools, (), verbs)
    if tail == "command" and not action.startswith("\\boxed{"):
        action = "\\boxed{" + action + "}"
    prose = model_prose(rng, echo, hint)[:max(0, MAX_GARBAGE_CHARS - len(action) - 1)]
    if not prose:
        return action
    return prose + rng.choice((" ", "\n", "\n\n", " Final answer: ")) + action


def garbage_action(rng: random.Random, tooluse: bool = False, advertised: Sequence[str] = (),
                   tools: Sequence[Any] = (), solution: Sequence[str] = (),
                   echo: Sequence[str] = (), hint: Sequence[str] = ()) -> str:
    """One garbage action drawn from ``rng`` (docs/design/sandbox.md lists what it can be);
    ``echo`` and ``hint``: words (``words_of``) that model-like replies may repeat."""
    verbs = _verbs(advertised) + list(VERBS)
    kinds = ["command", "command", "word", "word", "number", "sentence", "sentence",
             "box_letters", "box_big", "prose", "symbols", "reply", "reply", "reply", "reply"]
    if advertised:
        kinds += ["advertised", "advertised"]
    if solution:
        kinds += ["solution", "solution", "solution"]
    if tooluse:
        kinds += ["answer", "answer", "answer", "unknown_tool", "bad_json", "done"]
        if tools:
            kinds += ["typed_tool", "typed_tool", "typed_tool", "known_tool"]
    kind = rng.choice(kinds)
    if kind == "reply":
        return model_reply(rng, tooluse, advertised, tools, echo, hint)
    return _garbage_kind(kind, rng, tooluse, advertised, tools, solution, verbs)


def _garbage_kind(kind: str, rng: random.Random, tooluse: bool, advertised: Sequence[str],
                  tools: Sequence[Any], solution: Sequence[str], verbs: Sequence[str]) -> str:
    """One garbage action of ``kind`` (one of ``garbage_action``'s kinds, "reply" aside)."""
    if kind == "command":
        parts = [rng.choice(verbs)] + [str(_small(rng)) for _ in range(rng.randint(0, 3))]
        out = " ".join(parts)
        return out if rng.random() < 0.25 else "\\boxed{" + out + "}"
    if kind == "word":
        word = rng.choice(COMMON_WORDS)
        return "\\boxed{" + word + "}" if rng.random() < 0.8 else word
    if kind == "number":
        return "\\boxed{" + str(_small(rng)) + "}"
    if kind == "sentence":
        return _fill(rng.choice(_SENTENCES), rng, verbs)
    if kind == "box_letters":
        return "\\boxed{" + _word(rng) + "}"
    if kind == "box_big":
        parts = [_word(rng) if rng.random() < 0.5 else _big_number(rng)
                 for _ in range(rng.randint(1, 4))]
        return "\\boxed{" + " ".join(parts) + "}"
    if kind == "prose":
        return " ".join(_word(rng) for _ in range(rng.randint(1, 6)))
    if kind == "symbols":
        return "".join(rng.choice(_SYMBOLS) for _ in range(rng.randint(1, 40)))
    if kind == "advertised":
        return mutate_action(rng.choice(list(advertised)), rng)
    if kind == "solution":
        return mutate_action(rng.choice(list(solution)), rng)
    if kind == "answer":
        return "<answer>" + _fill(rng.choice(_ANSWERS), rng, verbs) + "</answer>"
    if kind == "done":
        return ANSWER
    if kind == "unknown_tool":
        return format_tool_call(rng.choice((_word(rng), rng.choice(VERBS))),
                                {rng.choice(COMMON_WORDS): _bad_value(rng)})
    if kind == "bad_json":
        return "<tool_call>{" + _word(rng) + ": " + _big_number(rng) + "</tool_call>"
    if kind == "typed_tool":
        return _typed_tool_call(tools, rng)
    name, params = rng.choice(_tool_names(tools) or [(_word(rng), [])])
    return format_tool_call(name, {p: _bad_value(rng) for p in params})


def garbage_actions(seed: int, n: int, tooluse: bool = False, advertised: Sequence[str] = (),
                    tools: Sequence[Any] = (), *, solution: Sequence[str] = (),
                    observation: str | None = None, hint: str | None = None) -> list[str]:
    """``n`` garbage actions for a program, fixed by ``seed``: the same seed, ``advertised``
    actions, tool schemas, ``solution``, ``observation`` and ``hint`` give the same list.
    ``tools`` are the program's ``tools()`` schemas; ``solution`` its solution actions for the
    episode's seed (a third of the lists then start with the whole solution made wrong in one
    place, ``mutate_solution``; single actions are sometimes mutated solution actions);
    ``observation`` (an observation of the program) and ``hint`` (its hint): text whose words
    model-like replies sometimes repeat (a program that pays for echoing its hint's phrase
    pays for the hint, not for the task)."""
    rng = random.Random(seed)
    n = max(0, n)
    solution = [a for a in solution if isinstance(a, str)]
    echo, hint_words = words_of(observation), words_of(hint)
    out: list[str] = []
    if solution and rng.random() < 1 / 3:
        out = mutate_solution(solution, rng)[:n]
    while len(out) < n:
        out.append(garbage_action(rng, tooluse, advertised, tools, solution, echo, hint_words))
    return out


def random_policy_actions(seed: int, n: int, tooluse: bool = False,
                          advertised: Sequence[str] = (), tools: Sequence[Any] = (), *,
                          solution: Sequence[str] = ()) -> list[str]:
    """``n`` actions of the random-policy baseline, fixed by ``seed``: each a random pick among
    the advertised actions (as they are or mutated) and mutations of the solution actions
    (``mutate_action`` with numbers redrawn, not shifted: a shifted secret is often still
    close enough for honest partial credit; never a solution action unchanged); garbage where
    the program offers neither."""
    rng = random.Random(seed)
    solution = [a for a in solution if isinstance(a, str)]
    advertised = list(advertised)
    out = []
    for _ in range(max(0, n)):
        pools = (["advertised"] if advertised else []) + (["solution"] if solution else [])
        if not pools:
            out.append(garbage_action(rng, tooluse, advertised, tools))
            continue
        if rng.choice(pools) == "solution":
            out.append(mutate_action(rng.choice(solution), rng, near=False))
        else:
            action = rng.choice(advertised)
            out.append(action if rng.random() < 0.5 else mutate_action(action, rng, False))
    return out
