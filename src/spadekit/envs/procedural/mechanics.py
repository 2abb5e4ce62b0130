"""The parts a procedural game is built from: hidden state, information action, scoring rule and
turn structure (the procedural pool).

Every part is ordinary Python source written so that ANY hidden state combines with ANY other
part. A hidden state is a helper class (``HiddenCell``, ``HiddenOrder``, ...) built in ``reset``
as ``self.hidden = HiddenX(self.rng)`` with ``read(words)``, ``close(candidate)`` in [0, 1],
``answer()``, ``fact(k)`` and ``PARTS``; an information action defines ``_look(words)``; a
scoring rule ``_verdict(guess) -> (reward, text)`` (1.0 only when exact); a turn structure is
``step`` itself. ``compose`` puts them into one program, each part under a comment naming it.
Placeholders (``{name}``) are filled from the surface and drawn numbers (not ``str.format``).
Details: docs/design/envs.md.
"""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["HIDDEN", "INFO", "SCORING", "TURNS", "Hidden", "Info", "Scoring", "Turns"]


@dataclass(frozen=True)
class Hidden:
    """A kind of hidden state: what the agent must find out, and its five methods."""

    name: str
    skill: str
    setup: str
    """Lines of the helper class's ``__init__(self, rng)`` (8 spaces) that draw the hidden
    state from ``rng``."""
    methods: str
    """The helper class's ``PARTS`` and its ``read``, ``close``, ``answer`` and ``fact`` (4
    spaces)."""
    goal: str
    """The observation's sentence about what is hidden."""
    example: str
    """An example candidate, as the agent would write it after a verb."""
    plan: str = ""
    """How the program's opening design comment names it (e.g. ``hidden number``)."""
    needs: tuple[str, ...] = ()
    """Surface slots it uses (``items``: a list of words; ``top``, ``rows``, ``cols``, ``length``:
    numbers)."""


@dataclass(frozen=True)
class Info:
    """An information action: a command that reveals something without ending the episode."""

    name: str
    method: str
    """``_look(self, words) -> str`` (4 spaces)."""
    usage: str
    """How the observation tells the command (``{verb}`` is the command word)."""
    solution_step: str
    """A Python expression: the information action of the reference solution."""
    hint: str
    """The strategy sentence of a hint for a program that uses this action."""


@dataclass(frozen=True)
class Scoring:
    """How the final answer is scored (partial credit allowed, 1.0 only when exactly right)."""

    name: str
    method: str
    """``_verdict(self, guess) -> (reward, text)`` (4 spaces); ``guess`` is ``hidden.read``'s result
    (None for an unreadable answer); 1.0 only for an exact one."""
    rule: str
    """The observation's sentence about scoring."""
    skill: str | None = None
    """A skill this rule makes the game about (``Optimization`` for a cost on looking)."""


@dataclass(frozen=True)
class Turns:
    """A turn structure: the ``step`` method, its control flow over the two commands."""

    name: str
    step: str
    """``step(self, action)`` and any helper it needs (4 spaces); ``{verb}``, ``{answer_verb}``
    and ``{usage_reminder}`` are filled in."""
    init: str = ""
    """Lines of ``reset`` (8 spaces) that set its state."""
    rule: str = ""
    """The observation's sentence about the structure (may be empty)."""


# -- hidden state ----------------------------------------------------------------------------

_NUMBER = Hidden(
    name="number", plan="hidden number", skill="Mathematical_Reasoning", needs=("top",),
    setup="        self.secret = rng.randint(1, {top})\n",
    methods='''\
    PARTS = 3

    def read(self, words):
        if words and words[0].isdigit():
            return int(words[0])
        return None

    def close(self, guess):
        return max(0.0, 1.0 - abs(guess - self.secret) / {top})

    def answer(self):
        return str(self.secret)

    def fact(self, k):
        s = self.secret
        if k % 3 == 1:
            return "the number is " + ("even" if s % 2 == 0 else "odd")
        if k % 3 == 2:
            return "it leaves %d when divided by 7" % (s % 7)
        return "it lies from %d to %d" % (s - s % 10, s - s % 10 + 9)
''',
    goal="A whole number from 1 to {top} is hidden.", example="{half}")

_CODE = Hidden(
    name="code", plan="hidden code", skill="Pattern_Recognition", needs=("items", "length"),
    setup=("        self.symbols = {items}\n"
           "        self.secret = [rng.choice(self.symbols) for _ in range({length})]\n"),
    methods='''\
    PARTS = {length}

    def read(self, words):
        if len(words) >= {length} and all(w in self.symbols for w in words[:{length}]):
            return words[:{length}]
        return None

    def close(self, code):
        return sum(a == b for a, b in zip(code, self.secret)) / {length}

    def answer(self):
        return " ".join(self.secret)

    def fact(self, k):
        i = (k - 1) % {length}
        return "slot %d holds %s" % (i + 1, self.secret[i])
''',
    goal="A hidden code of {length} symbols, each one of: {item_list}.",
    example="{code_example}")

_CELL = Hidden(
    name="cell", plan="hidden cell", skill="Spatial_Reasoning", needs=("rows", "cols"),
    setup=("        self.secret = (rng.randrange({rows}), rng.randrange({cols}))\n"),
    methods='''\
    PARTS = 2

    def read(self, words):
        if len(words) >= 2 and words[0].isdigit() and words[1].isdigit():
            return (int(words[0]), int(words[1]))
        return None

    def close(self, cell):
        far = abs(cell[0] - self.secret[0]) + abs(cell[1] - self.secret[1])
        return max(0.0, 1.0 - far / ({rows} + {cols} - 2))

    def answer(self):
        return "%d %d" % self.secret

    def fact(self, k):
        if k % 2 == 1:
            return "the row is %d" % self.secret[0]
        return "the column is %d" % self.secret[1]
''',
    goal="One cell of a grid with rows 0-{last_row} and columns 0-{last_col} is hidden.",
    example="{mid_row} {mid_col}")

_CAUSE = Hidden(
    name="cause", plan="hidden cause", skill="Causal_Inference", needs=("items",),
    setup=("        self.items = {items}\n"
           "        self.secret = rng.choice(self.items)\n"),
    methods='''\
    PARTS = {count}

    def read(self, words):
        if words and words[0] in self.items:
            return words[0]
        return None

    def close(self, item):
        gap = abs(self.items.index(item) - self.items.index(self.secret))
        return 1.0 - gap / ({count} - 1)

    def answer(self):
        return self.secret

    def fact(self, k):
        item = self.items[(k - 1) % {count}]
        return item + (" causes" if item == self.secret else " does not cause") + " the effect"
''',
    goal="Exactly one of {item_list} causes the effect.", example="{first_item}")

_ORDER = Hidden(
    name="order", plan="hidden order", skill="Logical_Deduction", needs=("items",),
    setup=("        self.secret = list({items})\n"
           "        rng.shuffle(self.secret)\n"),
    methods='''\
    PARTS = {count}

    def read(self, words):
        if sorted(words[:{count}]) == sorted(self.secret):
            return words[:{count}]
        return None

    def close(self, order):
        return sum(a == b for a, b in zip(order, self.secret)) / {count}

    def answer(self):
        return " ".join(self.secret)

    def fact(self, k):
        i = (k - 1) % {count}
        return "place %d belongs to %s" % (i + 1, self.secret[i])
''',
    goal="{item_list} stand in a hidden order, first to last.", example="{item_words}")

HIDDEN: dict[str, Hidden] = {h.name: h for h in (_NUMBER, _CODE, _CELL, _CAUSE, _ORDER)}
"""Hidden states by name."""

# -- information actions ---------------------------------------------------------------------

_PROBE = Info(
    name="probe",
    method='''\
    def _look(self, words):
        guess = self.hidden.read(words)
        if guess is None:
            return "Give a candidate after the command, e.g. \\\\boxed{{verb} {example}}."
        return "Closeness of that candidate: %.2f (1.00 is exact)." % self.hidden.close(guess)
''',
    usage="\\boxed{{verb} {example}} tells how close a candidate is, from 0.00 to 1.00",
    solution_step='"\\\\boxed{{verb} " + self.hidden.answer() + "}"',
    hint="Measure how close trial candidates are and narrow down step by step before "
         "committing.")

_REVEAL = Info(
    name="reveal",
    method='''\
    def _look(self, words):
        parts = self.hidden.PARTS
        if not words or not words[0].isdigit() or not 1 <= int(words[0]) <= parts:
            return "Ask for a fact by number, from 1 to %d." % parts
        return "Fact %s: %s." % (words[0], self.hidden.fact(int(words[0])))
''',
    usage="\\boxed{{verb} K} shows fact number K (1 to {parts})",
    solution_step='"\\\\boxed{{verb} 1}"',
    hint="Ask for the numbered facts first and combine them; together they pin the answer "
         "down.")

_CLUE = Info(
    name="clue",
    method='''\
    def _look(self, words):
        n = self.looks + 1
        return "Clue %d: %s." % (n, self.hidden.fact(n))
''',
    usage="\\boxed{{verb}} gives the next clue",
    solution_step='"\\\\boxed{{verb}}"',
    hint="Collect clues one at a time and keep only the answers that fit all of them.")

INFO: dict[str, Info] = {i.name: i for i in (_PROBE, _REVEAL, _CLUE)}
"""Information actions by name."""

# -- scoring rules ---------------------------------------------------------------------------

_EXACT = Scoring(
    name="exact",
    method='''\
    def _verdict(self, guess):
        if guess is not None and self.hidden.close(guess) >= 1.0:
            return 1.0, "Exactly right."
        return 0.0, "Wrong: it was %s." % self.hidden.answer()
''',
    rule="An exact answer scores 1.0; anything else scores 0.")

_STEEP = Scoring(
    name="steep",
    method='''\
    def _verdict(self, guess):
        closeness = 0.0 if guess is None else self.hidden.close(guess)
        reward = round(closeness ** 4, 3)
        return reward, "Closeness %.2f, score %.3f." % (closeness, reward)
''',
    rule="An answer scores its closeness to the hidden one to the fourth power (exact: 1.0).")

_BANDED = Scoring(
    name="banded",
    method='''\
    def _verdict(self, guess):
        closeness = self.hidden.close(guess) if guess is not None else 0.0
        for floor, reward in ((1.0, 1.0), (0.75, 0.3)):
            if closeness >= floor:
                return reward, "Score %.1f." % reward
        return 0.0, "Too far off: score 0."
''',
    rule="An exact answer scores 1.0, a near one (closeness 0.75 or more) 0.3, others 0.")

_THRIFTY = Scoring(
    name="thrifty", skill="Optimization",
    method='''\
    def _verdict(self, guess):
        if guess is None or self.hidden.close(guess) < 1.0:
            return 0.0, "Wrong answer."
        cost = 0.1 * max(0, self.looks - 1)
        return max(0.2, 1.0 - cost), "Right, after %d looks." % self.looks
''',
    rule="An exact answer scores 1.0 minus 0.1 for every look after the first; others 0.")

SCORING: dict[str, Scoring] = {s.name: s for s in (_EXACT, _STEEP, _BANDED, _THRIFTY)}
"""Scoring rules by name."""

# -- turn structures -------------------------------------------------------------------------

_OPEN = Turns(
    name="open", init="        self.over = False\n",
    step='''\
    def step(self, action):
        if self.over:
            return "The episode is over.", 0.0, True, False, {}
        self.turns += 1
        words = last_box(action).split() or [""]
        reward = 0.0
        if words[0] == "{verb}":
            text = self._look(words[1:])
            self.looks += 1
        elif words[0] == "{answer_verb}":
            reward, text = self._verdict(self.hidden.read(words[1:]))
            self.over = True
        else:
            text = {usage_reminder}
        cut = not self.over and self.turns >= self.max_turns
        return text, reward, self.over, cut, {}
''')

_BUDGET = Turns(
    name="budget", init="        self.over = False\n        self.left = {budget}\n",
    rule="You may look at most {budget} times.",
    step='''\
    def step(self, action):
        if self.over:
            return "The episode is over.", 0.0, True, False, {}
        self.turns += 1
        command, *rest = last_box(action).split() or [""]
        if command == "{verb}" and self.left > 0:
            self.left -= 1
            self.looks += 1
            return self._after(self._look(rest) + " Looks left: %d." % self.left, 0.0)
        if command == "{verb}":
            return self._after("No looks left: answer now.", 0.0)
        if command == "{answer_verb}":
            self.over = True
            reward, text = self._verdict(self.hidden.read(rest))
            return self._after(text, reward)
        return self._after({usage_reminder}, 0.0)

    def _after(self, text, reward):
        answered = self.over
        cut = not answered and self.turns >= self.max_turns
        self.over = answered or cut
        return text, reward, answered, cut, {}
''')

_GATED = Turns(
    name="gated", init='        self.phase = "start"\n',
    rule="An answer counts only after at least one look.",
    step='''\
    def step(self, action):
        if self.phase == "done":
            return "The episode is over.", 0.0, True, False, {}
        self.turns += 1
        words = last_box(action).split()
        verb = words[0] if words else ""
        reward, ended = 0.0, False
        if verb == "{verb}":
            text = self._look(words[1:])
            self.looks += 1
            self.phase = "ready"
        elif verb == "{answer_verb}" and self.phase == "ready":
            reward, text = self._verdict(self.hidden.read(words[1:]))
            ended = True
        elif verb == "{answer_verb}":
            text = "Look at least once before you answer."
        else:
            text = {usage_reminder}
        truncated = not ended and self.turns >= self.max_turns
        if ended or truncated:
            self.phase = "done"
        return text, reward, ended, truncated, {}
''')

TURNS: dict[str, Turns] = {t.name: t for t in (_OPEN, _BUDGET, _GATED)}
"""Turn structures by name."""


@dataclass(frozen=True)
class Catalogue:
    """The four registries together (what ``compose`` combines)."""

    hidden: dict[str, Hidden] = field(default_factory=lambda: dict(HIDDEN))
    info: dict[str, Info] = field(default_factory=lambda: dict(INFO))
    scoring: dict[str, Scoring] = field(default_factory=lambda: dict(SCORING))
    turns: dict[str, Turns] = field(default_factory=lambda: dict(TURNS))
