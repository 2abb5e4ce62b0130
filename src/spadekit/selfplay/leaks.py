"""The hint leak check: does a privileged hint hand the agent the answer instead of an insight?

SPEC point 2 wants a hint of insight, "never the exact answer or concrete ids/values"; the design
phase drops a leaking hint. **Literal** (:func:`leaked_fragments`): the hint is compared, as
lower-cased letter/digit tokens, with needles from the solution's trace on seeds drawn per hint
(commands, their arguments, module constants they use, runs of three commands), also in encoded
forms (reversed, acrostic, Caesar shift, split, digits apart, small arithmetic); needles every
using seed's first observation shows are exempt. **Empirical** (``leak_probe``): garbage plus
the hint must not win. Every scan is linear, capped and under a wall-clock budget: a hostile
hint or solution can neither raise out of the check nor stall it. Matching rules in detail:
docs/design/selfplay.md.
"""

from __future__ import annotations

import ast
import re
import time
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from typing import Any, Iterable

from spadekit.envs.actions import parse_tool_calls

__all__ = ["LITERAL_BUDGET_S", "SolutionTrace", "STOP_WORDS", "argument_values", "arithmetic",
           "boxed_contents", "hint_leaks", "initials", "leaked_fragments", "number_words",
           "numbers_in", "program_constants", "reversal_cued", "spelled_digits", "tokens"]

MAX_HINT_CHARS = 4000
MAX_ACTION_CHARS = 8192
MAX_COMMAND_CHARS = 400
MAX_ACTIONS = 256
MAX_BOXES = 32
MAX_TOOL_CALLS = 16
MAX_VALUES = 256
MAX_DEPTH = 32
MAX_NEEDLES = 512
MAX_TOKENS = 2000
MAX_CONSTANTS = 512
MAX_SEQUENCE = 25
SEQUENCE_RUN = 3
SEQUENCE_GAP = 3
LITERAL_BUDGET_S = 2.0
ENCODED_MIN = 5  # letters an encoded needle needs without a cue word (one fewer with one)
SPLIT_GAP = 3
SPLIT_PIECES = 3
MAX_SHOWN = 32
REVERSAL_CUES = frozenset("backwards backward reversed reverse reverses mirrored mirror swapped "
                          "swap swaps flipped flip".split())
SHIFT_CUES = frozenset("shift shifted shifts rotate rotated rot13 caesar alphabet step steps "
                       "forward".split())
INITIAL_CUES = frozenset("first initial initials letters acrostic".split())
_OPERATORS = {"plus": lambda a, b: a + b, "minus": lambda a, b: a - b,
              "times": lambda a, b: a * b, "multiplied": lambda a, b: a * b,
              "divided": lambda a, b: a // b if b and a % b == 0 else None}

#: Words never checked or tried on their own: function words and words every hint may use.
STOP_WORDS = frozenset("""
a an the and or but nor not no yes so if then than else when while until before after first last
next each every all any some both few more most less least many much one once twice again also
only just very too still then there here this that these those it its is are was were be been
being am do does did done doing have has had having will would can could should shall may might
must of in on at by for from to into onto with without within over under about above below up
down out off as per via you your yours we our they them their he she his her i me my mine use
using try trying keep make sure way ways what which who whom whose why how where
""".split())

_ALNUM = re.compile(r"[^\W_]+")
_DIGITS_APART = re.compile(r"(?<![\w.,])\d(?:[ \t]+\d){1,40}(?![\w]|[.,]\d)")
_CLAUSE = re.compile(r"[^.;:!?\n]+")
_CAPITALISED = re.compile(r"(?:\b[A-Z][a-z]*\b[\s,]*){3,40}")
_NUMBER = re.compile(r"(?<![\w.,])-?\d{1,40}(?:,\d{3})*(?:\.\d{1,40})?(?![\w]|[.,]\d)")
_BOX_OR_BRACE = re.compile(r"\\boxed\s*\{|[{}]")
_ANSWER = re.compile(r"<answer>([^<]{0,400})</answer>", re.IGNORECASE)
_UNITS = {w: i for i, w in enumerate(
    "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen "
    "fifteen sixteen seventeen eighteen nineteen".split())}
_TENS = {w: 10 * i for i, w in enumerate(
    "_ _ twenty thirty forty fifty sixty seventy eighty ninety".split()) if w != "_"}


class SolutionTrace(list):
    """A solution's actions over the leak seeds (a plain ``list`` of action strings, as before)
    with what the literal check reads besides: the actions per seed, the first observation of
    each seed and the program's constants (:func:`program_constants`)."""

    def __init__(self, actions: Iterable[str] = (), *, per_seed: Iterable[Iterable[str]] = (),
                 observations: Iterable[str] = (), constants: Iterable[Any] = ()) -> None:
        super().__init__(actions)
        self.per_seed = [list(s) for s in per_seed]
        self.observations = [o for o in observations if isinstance(o, str)]
        self.constants = list(constants)


class _Clock:
    def __init__(self, budget_s: float) -> None:
        self.deadline = time.monotonic() + max(0.0, float(budget_s))

    def over(self) -> bool:
        return time.monotonic() > self.deadline


# -- scanners ---------------------------------------------------------------------------------


def tokens(text: Any, limit: int = MAX_TOKENS, cap: int = MAX_HINT_CHARS) -> list[str]:
    """The lower-cased runs of letters and digits of ``text`` (its first ``cap`` characters)."""
    if not isinstance(text, str):
        return []
    out = []
    for match in _ALNUM.finditer(text[:cap].lower()):
        out.append(match.group(0))
        if len(out) >= limit:
            break
    return out


def _key(text: str) -> str:
    return "".join(tokens(text, cap=MAX_COMMAND_CHARS))


def _canonical(number: str) -> str | None:
    try:
        value = Decimal(number.replace(",", ""))
    except (InvalidOperation, ValueError):
        return None
    if not value.is_finite():
        return None
    text = format(value.normalize(), "f")
    return "0" if text in ("-0", "0") else text


def numbers_in(text: Any, cap: int = MAX_HINT_CHARS) -> set[str]:
    """The whole numeric tokens of ``text``, canonical (``"4,321"`` -> ``"4321"``, ``"7.50"`` ->
    ``"7.5"``); a number inside a word or a longer number is not one (``x7``, ``7`` in ``7.5``)."""
    if not isinstance(text, str):
        return set()
    found = (_canonical(m.group(0)) for m in _NUMBER.finditer(text[:cap]))
    return {n for n in found if n is not None}


def number_words(toks: list[str]) -> set[str]:
    """Numbers 0-999 written in words in ``toks`` (``forty``, ``two`` -> ``"42"``); a lone
    ``one`` is left out (it is a pronoun as often as a number)."""
    out, i = set(), 0
    while i < len(toks):
        value, j = _words_value(toks, i)
        if j > i and not (j == i + 1 and toks[i] == "one"):
            out.add(str(value))
        i = max(j, i + 1)
    return out


def _operand_after(toks: list[str], j: int) -> int | None:
    if j < len(toks) and toks[j].isdigit() and len(toks[j]) <= 12:
        return int(toks[j])
    value, end = _words_value(toks, j)
    return value if end > j else None


def _operand_before(toks: list[str], i: int) -> int | None:
    if i > 0 and toks[i - 1].isdigit() and len(toks[i - 1]) <= 12:
        return int(toks[i - 1])
    for k in range(max(0, i - 4), i):
        value, end = _words_value(toks, k)
        if end == i:
            return value
    return None


def arithmetic(toks: list[str]) -> set[str]:
    """The values of the small sums in ``toks``: ``a plus|minus|times b``, ``a multiplied by
    b`` and ``a divided by b`` (exact only), each operand digits or number words (``six times
    seven`` -> ``"42"``, ``40 plus 2`` -> ``"42"``); one operator at a time, no chains."""
    out = set()
    for i, tok in enumerate(toks[:MAX_TOKENS]):
        op = _OPERATORS.get(tok)
        if op is None:
            continue
        j = i + 2 if tok in ("multiplied", "divided") else i + 1
        if tok in ("multiplied", "divided") and (i + 1 >= len(toks) or toks[i + 1] != "by"):
            continue
        a, b = _operand_before(toks, i), _operand_after(toks, j)
        value = op(a, b) if a is not None and b is not None else None
        if value is not None:
            out.add(str(value))
    return out


def spelled_digits(text: Any, cap: int = MAX_HINT_CHARS) -> set[str]:
    """Numbers said as single digits apart with spaces only between them (``4 2`` -> ``"42"``;
    ``4, 2`` is a list, not a number)."""
    if not isinstance(text, str):
        return set()
    return {_canonical("".join(m.group(0).split())) or "" for m in
            _DIGITS_APART.finditer(text[:cap])} - {""}


def initials(text: Any, cap: int = MAX_HINT_CHARS, clauses: bool = True) -> list[str]:
    """Acrostic readings of ``text``: the lower-cased initials of each run of three or more
    capitalised words, then (``clauses``) of each clause of three or more words."""
    if not isinstance(text, str):
        return []
    text = text[:cap]
    runs = ["".join(w[0] for w in tokens(m.group(0))) for m in _CAPITALISED.finditer(text)]
    parts = ["".join(w[0] for w in tokens(m.group(0))) for m in _CLAUSE.finditer(text)]
    return list(dict.fromkeys(r for r in runs + (parts if clauses else []) if len(r) >= 3))


def reversal_cued(toks: list[str]) -> bool:
    """Whether ``toks`` ask for something to be read reversed (``backwards``, ``swapped``...)."""
    return any(t in REVERSAL_CUES for t in toks)


def _words_value(toks: list[str], i: int) -> tuple[int, int]:
    value, j = _below_hundred(toks, i)
    if j > i and j < len(toks) and toks[j] == "hundred" and 0 < value < 10:
        rest, k = _below_hundred(toks, j + 2 if j + 1 < len(toks) and toks[j + 1] == "and"
                                 else j + 1)
        start = j + 2 if j + 1 < len(toks) and toks[j + 1] == "and" else j + 1
        return value * 100 + (rest if k > start else 0), (k if k > start else j + 1)
    return value, j


def _below_hundred(toks: list[str], i: int) -> tuple[int, int]:
    if i < len(toks) and toks[i] in _TENS:
        value = _TENS[toks[i]]
        if i + 1 < len(toks) and 0 < _UNITS.get(toks[i + 1], 0) < 10:
            return value + _UNITS[toks[i + 1]], i + 2
        return value, i + 1
    if i < len(toks) and toks[i] in _UNITS:
        return _UNITS[toks[i]], i + 1
    return 0, i


def boxed_contents(action: Any) -> list[str]:
    """Every balanced ``\\boxed{...}`` content of ``action``, nested ones too, in order of their
    openings; one pass over the first ``MAX_ACTION_CHARS`` characters, unclosed openings are
    dropped (not rescanned), contents longer than ``MAX_COMMAND_CHARS`` are skipped."""
    if not isinstance(action, str):
        return []
    text, found, stack = action[:MAX_ACTION_CHARS], [], []
    for match in _BOX_OR_BRACE.finditer(text):
        piece = match.group(0)
        if piece == "}":
            if stack:
                start = stack.pop()
                if start >= 0 and match.start() - start <= MAX_COMMAND_CHARS:
                    found.append((start, text[start:match.start()]))
                    if len(found) >= MAX_BOXES:
                        break
        else:
            stack.append(match.end() if piece != "{" else -1)
    return [content for _start, content in sorted(found)]


def argument_values(value: Any) -> list[str]:
    """The leaf strings and numbers of a tool call's arguments, in order, walked without
    recursion (at most ``MAX_VALUES`` leaves, ``MAX_DEPTH`` levels; booleans and None skipped)."""
    out: list[str] = []
    stack = [(value, 0)]
    while stack and len(out) < MAX_VALUES:
        item, depth = stack.pop()
        if isinstance(item, dict) or isinstance(item, (list, tuple)):
            if depth < MAX_DEPTH:
                children = list(item.values() if isinstance(item, dict) else item)[:MAX_VALUES]
                stack.extend((child, depth + 1) for child in reversed(children))
        elif isinstance(item, bool) or item is None:
            continue
        elif isinstance(item, int):
            if item.bit_length() <= 128:
                out.append(str(item))
        elif isinstance(item, float):
            if item == item and abs(item) != float("inf"):
                out.append(repr(item))
        elif isinstance(item, str):
            out.append(item[:MAX_COMMAND_CHARS])
    return out


def _tool_values(action: str) -> list[str]:
    if "<tool_call>" not in action.lower():
        return []
    try:  # a foreign parser on hostile text: deep JSON raises RecursionError, huge ints ValueError
        calls, _errors = parse_tool_calls(action[:MAX_ACTION_CHARS], strict=False,
                                          limit=MAX_TOOL_CALLS)
    except (RecursionError, ValueError, TypeError, MemoryError):
        return []
    values: list[str] = []
    for call in calls:
        values += argument_values(getattr(call, "arguments", None))
    return values


def program_constants(code: Any) -> list[Any]:
    """The string and number literals assigned at module level or in a class body of ``code``
    (alone or inside literal tuples, lists, sets and dicts); ``[]`` for code that does not parse."""
    if not isinstance(code, str):
        return []
    try:
        tree = ast.parse(code)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return []
    out: list[Any] = []
    bodies = [tree.body] + [node.body for node in tree.body if isinstance(node, ast.ClassDef)]
    for body in bodies:
        for node in body:
            value = node.value if isinstance(node, (ast.Assign, ast.AnnAssign)) else None
            stack = [value] if value is not None else []
            while stack and len(out) < MAX_CONSTANTS:
                item = stack.pop()
                if isinstance(item, ast.Constant):
                    if isinstance(item.value, (str, int, float)) and not isinstance(item.value,
                                                                                     bool):
                        out.append(item.value)
                elif isinstance(item, (ast.Tuple, ast.List, ast.Set)):
                    stack.extend(reversed(item.elts))
                elif isinstance(item, ast.Dict):
                    stack.extend(reversed([k for k in item.keys if k is not None] + item.values))
    return out


# -- needles ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Needle:
    text: str  # as the report shows it
    key: str  # the tokens joined
    kind: str  # command, argument, tool_value, constant
    number: str | None  # canonical, when the whole needle is one number


def _needle(text: Any, kind: str) -> _Needle | None:
    text = str(text)[:MAX_COMMAND_CHARS]
    key = _key(text)
    if not key:
        return None
    found = numbers_in(text.strip(), cap=MAX_COMMAND_CHARS)
    number = next(iter(found)) if len(found) == 1 and _NUMBER.fullmatch(text.strip()) else None
    return _Needle(" ".join(text.lower().split()), key, kind, number)


def _commands(action: str) -> list[str]:
    cut = action[:MAX_ACTION_CHARS]
    return boxed_contents(cut) + [m.group(1) for m in _ANSWER.finditer(cut)][:MAX_BOXES]


class _Hay:
    """A text's tokens with an index of where each token starts, its numbers (digits, words,
    digits said apart, evaluated sums), its acrostic and which cue words it holds."""

    def __init__(self, text: str) -> None:
        self.toks = tokens(text)
        self.at: dict[str, list[int]] = {}
        for i, tok in enumerate(self.toks):
            self.at.setdefault(tok, []).append(i)
        self.plain_numbers = numbers_in(text) | number_words(self.toks)
        self.numbers = self.plain_numbers | spelled_digits(text) | arithmetic(self.toks)
        self.spelled, run = set(), []
        for tok in self.toks + [""]:
            if len(tok) == 1 and tok.isdigit():
                run.append(tok)
                continue
            if len(run) >= 3:
                self.spelled.add("".join(run))
            run = []
        words = set(self.toks)
        self.cue = {"reversed": bool(words & REVERSAL_CUES), "shifted": bool(words & SHIFT_CUES),
                    "acrostic": bool(words & INITIAL_CUES)}
        self.acrostic = "".join(t[0] for t in self.toks)

    def runs(self, key: str, start: int = 0) -> Iterable[tuple[int, int]]:
        """Each ``(i, j)`` with ``toks[i:j]`` joining into ``key``, ``i >= start``, by ``i``."""
        starts = sorted(p for n in range(1, len(key) + 1) for p in self.at.get(key[:n], ())
                        if p >= start)
        for i in starts:
            size, j = len(self.toks[i]), i + 1
            while size < len(key) and j < len(self.toks) and key.startswith(self.toks[j], size):
                size += len(self.toks[j])
                j += 1
            if size == len(key):
                yield i, j

    def _spells(self, key: str) -> bool:
        return next(iter(self.runs(key)), None) is not None

    def has(self, needle: _Needle, min_chars: int, encoded: bool = True) -> str | None:
        """How this text gives ``needle``: ``""`` as written, ``" (reversed)"`` and the like
        for an encoded form (``encoded``: the module docstring's rules), ``None`` if not."""
        if needle.number is not None:
            digits = needle.number.lstrip("-")
            if needle.number in (self.numbers if encoded else self.plain_numbers) or (
                    digits.isdigit() and len(digits) >= 3 and digits in self.spelled):
                return ""
            back = _canonical(digits[::-1]) if digits.isdigit() and len(digits) >= 2 else None
            if encoded and self.cue["reversed"] and back != digits and back in self.numbers:
                return " (digits reversed)"
            return None
        if len(needle.key) < min_chars and not any(c.isdigit() for c in needle.key):
            return None
        if self._spells(needle.key):
            return ""
        return self._encoded(needle.key) if encoded else None

    def _encoded(self, key: str) -> str | None:
        def long(form: str) -> bool:
            return len(key) >= ENCODED_MIN - (1 if self.cue[form] else 0)

        if key[::-1] != key and long("reversed") and self._spells(key[::-1]):
            return " (reversed)"
        letters = key.isascii() and key.isalpha()
        if letters and long("acrostic") and key in self.acrostic:
            return " (initial letters)"
        if letters and long("shifted"):
            for shift in range(1, 26):
                moved = "".join(chr((ord(c) - 97 + shift) % 26 + 97) for c in key)
                if self._spells(moved):
                    return f" (letters shifted by {26 - shift})"
        if len(key) >= 4 and self._split(key):
            return " (split)"
        return None

    def _split(self, key: str) -> bool:
        """``key`` as 2 to ``SPLIT_PIECES`` tokens of two or more characters (no stop words)
        in order, at most ``SPLIT_GAP`` tokens apart (``xyz followed by zy``)."""
        stack = [(i + 1, len(t), 1) for n in range(2, len(key)) for i in self.at.get(key[:n], ())
                 for t in [key[:n]] if t not in STOP_WORDS]
        while stack:
            end, size, pieces = stack.pop()
            if pieces >= SPLIT_PIECES:
                continue
            for j in range(end, min(end + SPLIT_GAP + 1, len(self.toks))):
                tok = self.toks[j]
                if len(tok) >= 2 and tok not in STOP_WORDS and key.startswith(tok, size):
                    if size + len(tok) == len(key):
                        return True
                    stack.append((j + 1, size + len(tok), pieces + 1))
        return False


def _seed_keys(per_seed: list[list[str]]) -> list[set[str]]:
    """Per seed, the keys of its solution's commands, boxed tokens and tool values."""
    seed_sets: list[set[str]] = [set() for _ in per_seed]
    for k, seed_actions in enumerate(per_seed):
        for action in seed_actions[:MAX_ACTIONS]:
            if isinstance(action, str):
                seed_sets[k].update(_key(c) for c in _commands(action))
                seed_sets[k].update(t for c in boxed_contents(action) for t in tokens(c))
                seed_sets[k].update(_key(v) for v in _tool_values(action))
    return seed_sets


def _shown(needle: _Needle, shown: list[_Hay], uses: list[set[str]]) -> bool:
    """Whether the agent is told ``needle`` anyway: the first observation of every seed whose
    solution uses it shows it (of any seed, when no seed's solution names it as a whole)."""
    using = [k for k, keys in enumerate(uses) if needle.key in keys and k < len(shown)]
    if not using:
        return any(s.has(needle, 1, encoded=False) is not None for s in shown)
    return all(shown[k].has(needle, 1, encoded=False) is not None for k in using)


def _needles(actions: list[str], trace: Any, clock: _Clock) -> list[_Needle]:
    per_seed = getattr(trace, "per_seed", None) or []
    seed_sets = _seed_keys(per_seed)
    stable = set.intersection(*seed_sets) if len(seed_sets) >= 2 else set()
    out: list[_Needle] = []
    commands: list[str] = []
    for action in actions[:MAX_ACTIONS]:
        if clock.over() or len(out) >= MAX_NEEDLES:
            break
        if not isinstance(action, str):
            continue
        for command in _commands(action):
            commands.append(command)
            out.append(_needle(command, "command"))
            parts = command.split()
            if len(parts) > 1:
                out += [_needle(p, "argument") for p in parts[1:]]
        out += [_needle(v, "tool_value") for v in _tool_values(action)]
    keys = {_key(c) for c in commands}
    hay = _Hay("\n".join(commands)[:MAX_ACTION_CHARS]) if commands else None
    for value in getattr(trace, "constants", None) or []:
        if clock.over() or hay is None:
            break
        needle = _needle(value, "constant")
        if needle and (needle.key in keys or next(iter(hay.runs(needle.key)), None)):
            out.append(needle)
    kept, seen = [], set()
    for needle in out:
        if needle is None or needle.key in seen or needle.text in STOP_WORDS \
                or needle.key == "done":
            continue
        short_number = needle.number is not None and len(needle.number.lstrip("-")) < 3
        if short_number and needle.kind in ("argument", "tool_value") \
                and needle.key not in stable:
            continue
        seen.add(needle.key)
        kept.append(needle)
    return kept[:MAX_NEEDLES]


def _sequence_leak(hay: _Hay, per_seed: list[list[str]], clock: _Clock) -> str | None:
    """``SEQUENCE_RUN`` consecutive commands of one seed's solution, in order in the hint, with
    at most ``SEQUENCE_GAP`` tokens between them; returns them joined by ``" -> "``."""
    for seed_actions in per_seed:
        keys = []
        for action in seed_actions[:MAX_SEQUENCE]:
            found = _commands(action) if isinstance(action, str) else []
            keys.append(_key(found[-1]) if found else "")
        for k in range(len(keys) - SEQUENCE_RUN + 1):
            if clock.over():
                return None
            run = keys[k:k + SEQUENCE_RUN]
            if all(run) and _chain(hay, run):
                return " -> ".join(run)
    return None


def _chain(hay: _Hay, run: list[str]) -> bool:
    for _i, j in hay.runs(run[0]):
        end, ok = j, True
        for key in run[1:]:
            nxt = next((m for m in hay.runs(key, end) if m[0] - end <= SEQUENCE_GAP), None)
            if nxt is None:
                ok = False
                break
            end = nxt[1]
        if ok:
            return True
    return False


def leaked_fragments(hint: str | None, solution_actions: Iterable[str] | None,
                     min_chars: int = 3, *, budget_s: float = LITERAL_BUDGET_S) -> list[str]:
    """The solution fragments that ``hint`` spells out (the module docstring says which and
    how), each as lower-cased text with whitespace collapsed, in the order of the solution; a
    spelled-out sequence of commands reads ``"a -> b -> c"``. ``solution_actions`` is a
    :class:`SolutionTrace` or any iterable of action strings (then nothing is known of the
    seeds, the first observations or the constants: short numeric arguments are not checked
    and nothing is exempt as shown)."""
    if not isinstance(hint, str) or not hint.strip() or solution_actions is None:
        return []
    clock = _Clock(budget_s)
    actions = []
    for action in solution_actions:
        if len(actions) >= MAX_ACTIONS:
            break
        if isinstance(action, str):
            actions.append(action)
    trace = solution_actions if isinstance(solution_actions, SolutionTrace) else None
    hay = _Hay(hint)
    shown = [_Hay(o[:MAX_ACTION_CHARS]) for o in (trace.observations if trace else [])
             ][:MAX_SHOWN]
    uses = _seed_keys(trace.per_seed if trace else [])
    found = []
    for needle in _needles(actions, trace, clock):
        if clock.over():
            break
        how = hay.has(needle, min_chars)
        if how is not None and not _shown(needle, shown, uses):
            found.append(needle.text + how)
    per_seed = trace.per_seed if trace and trace.per_seed else [actions]
    sequence = None if found else _sequence_leak(hay, per_seed, clock)
    return found + ([sequence] if sequence else [])


def hint_leaks(hint: str | None, solution_actions: Iterable[str] | None) -> bool:
    """Whether ``hint`` spells out part of the solution (:func:`leaked_fragments`)."""
    return bool(leaked_fragments(hint or "", solution_actions))
