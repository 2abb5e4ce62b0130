"""``KitEnv``: the base class a kit program's one ``...Env`` class subclasses (v1, frozen).

A subclass names a ``theme`` and four parts, one per slot: ``hidden`` (a ``Hidden``),
``info`` (an ``Info``), ``scoring`` (a ``Scoring``) and ``turns`` (a ``Turns``). ``KitEnv``
then is a complete game of the Gymnasium contract: ``reset(*, seed=None, options=None) ->
(observation, info)`` draws the secret from ``random.Random(seed)`` (its only randomness) and
writes the observation from the theme and the parts; ``step(action) -> (observation, reward,
terminated, truncated, info)`` reads the command from the last ``\\boxed{...}`` of the action
and lets the turn structure play it; ``solution()`` is derived (the looks the turn structure
requires, then the exact answer). A program may override ``intro``, ``command``, ``look``,
``verdict``, ``reminder`` and ``solution``, add methods, or write a part of its own; that code
is used as written. ``reset`` and ``step`` are the kit's machinery (they keep the observation
written from the parts and the solution derived) and are not overridden: a program that needs
another loop is a whole program. Checked when the class is made (and again when it is
constructed): each slot holds a part of its kind, the theme is one line of text, the command
words differ, the machinery is the kit's, and the hidden state is not the same on every seed;
the opening observation and the reminder must read the same with another secret in place (they
state the rules; looks tell about the secret). Failures are ``KitError`` naming the class and
slot or method, or the part and parameter. These guards stop the cheap ways to turn a kit
program into something other than a game; code that goes around them is judged by the
validator and the watch, as a whole program's is.
"""

import random
import re

from .hidden import Hidden
from .info import Info
from .params import KitError
from .scoring import Scoring
from .turns import Turns

__all__ = ["KitEnv"]

SLOTS = (("hidden", Hidden), ("info", Info), ("scoring", Scoring), ("turns", Turns))
FINAL = ("reset", "step", "remind", "_shown_alike")
"""The kit's machinery: a subclass that overrides any of them is refused."""
_BOX_OPEN = re.compile(r"\\boxed\s*\{")
_BRACES = re.compile(r"[{}]")
VARIETY_SEEDS = 32
"""The hidden state is drawn on seeds 0 to this - 1 when a class is checked..."""
VARIETY = 4
"""...and must take at least this many values there."""


def last_box(text):
    """The content of the last top-level ``\\boxed{...}`` of ``text``, as
    ``spadekit.envs.actions.extract_boxed`` reads it (braces inside must balance); None without
    one, or when a box does not close. One pass over the braces."""
    if not isinstance(text, str):
        return None
    found, pos = None, 0
    while True:
        match = _BOX_OPEN.search(text, pos)
        if match is None:
            return found
        depth, end = 1, None
        for brace in _BRACES.finditer(text, match.end()):
            depth += 1 if brace.group() == "{" else -1
            if not depth:
                end = brace.start()
                break
        if end is None:
            return None
        found, pos = text[match.end():end], end + 1


def _check_class(cls):
    """The checks of the module docstring, once per class (remembered in its own dict)."""
    if cls.__dict__.get("_kit_checked"):
        return
    name = cls.__name__
    for method in FINAL:
        if getattr(cls, method) is not getattr(KitEnv, method):
            raise KitError("%s.%s: a kit program does not override %s (the kit writes the "
                           "observation from the parts and derives the solution); override "
                           "intro, command, look, verdict or reminder, or a part, or write a "
                           "whole program without the kit" % (name, method, method))
    for slot, kind in SLOTS:
        part = getattr(cls, slot, None)
        if not isinstance(part, kind):
            what, example = {"hidden": ("a hidden-state", "HiddenNumber()"),
                             "info": ("an information", "Probe()"),
                             "scoring": ("a scoring", "ScoreExact()"),
                             "turns": ("a turn-structure", "OpenTurns()")}[slot]
            raise KitError("%s.%s: must be %s part such as %s, got %s" % (
                name, slot, what, example, "nothing" if part is None else type(part).__name__))
    theme = getattr(cls, "theme", None)
    if not isinstance(theme, str) or not 3 <= len(theme.strip()) <= 160 or "\n" in theme:
        raise KitError("%s.theme: must be one line of 3 to 160 characters, got %s"
                       % (name, repr(theme)[:60]))
    verb = cls.answer_verb
    if not isinstance(verb, str) or not verb.isalpha() or not verb.islower() or \
            verb == cls.info.verb:
        raise KitError("%s.answer_verb: must be one lowercase word other than the info verb "
                       "%r, got %r" % (name, cls.info.verb, verb))
    seen = []
    for seed in range(VARIETY_SEEDS):
        secret = cls.hidden.draw(random.Random(seed))
        if secret not in seen:
            seen.append(secret)
    if len(seen) < VARIETY:
        raise KitError("%s.draw: the hidden state took %d value(s) on %d seeds; a game needs "
                       "one that changes with the seed (at least %d)"
                       % (type(cls.hidden).__name__, len(seen), VARIETY_SEEDS, VARIETY))
    cls._kit_checked = True


class KitEnv:
    """A game from a theme and four parts (see the module docstring)."""

    theme = None
    hidden = None
    info = None
    scoring = None
    turns = None
    answer_verb = "answer"

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        # The sandbox counts a solution() only where the program's own classes define it (a
        # base class's placeholder must not count); the derived one is real, so each subclass
        # holds it itself, and the validator replays it as it replays any program's.
        if "solution" not in cls.__dict__:
            cls.solution = cls.solution
        if cls.__name__.endswith("Env"):
            _check_class(cls)

    def __init__(self, max_turns=None, **kwargs):
        _check_class(type(self))
        limit = self.turns.limit
        if isinstance(max_turns, int) and not isinstance(max_turns, bool) and \
                1 <= max_turns < limit:
            limit = max_turns  # the caller's cap, when it is lower
        self.max_turns = limit
        self.rng, self.secret, self._other = None, None, None
        self.turn = self.looks = 0
        self.over = True

    # -- the Gymnasium contract ------------------------------------------------------------

    def reset(self, *, seed=None, options=None):
        self.rng = random.Random(seed)
        self.secret = self.hidden.draw(self.rng)
        self.turn = self.looks = 0
        self.over = False
        self._other = None
        for k in range(VARIETY_SEEDS):  # another secret, for _shown_alike
            other = self.hidden.draw(random.Random(k))
            if other != self.secret:
                self._other = other
                break
        return self._shown_alike("intro"), {}

    def step(self, action):
        if self.over:
            return "The episode is over.", 0.0, True, False, {}
        self.turn += 1
        verb, words = self.command(action)
        text, reward, ended = self.turns.play(self, verb, words)
        truncated = not ended and self.turn >= self.max_turns
        if truncated:
            text += " No turns left."
        self.over = ended or truncated
        return text, float(reward), bool(ended), truncated, {}

    def solution(self):
        look = "\\boxed{%s}" % self.info.step(self)
        answer = "\\boxed{%s %s}" % (self.answer_verb, self.hidden.answer(self.secret))
        return [look] * self.turns.free_looks() + [answer]

    def remind(self):
        """The reminder after an unknown command (what ``Turns.play`` shows)."""
        return self._shown_alike("reminder")

    def _shown_alike(self, name):
        """The text of method ``name``, refused when it changes with another secret in place:
        called again with the other secret and the episode's generator as it was, then all
        back."""
        method = getattr(self, name)
        before = self.rng.getstate()
        text = method()
        if self._other is None:
            return text
        real, after = self.secret, self.rng.getstate()
        self.secret = self._other
        self.rng.setstate(before)
        try:
            again = method()
        finally:
            self.secret = real
            self.rng.setstate(after)
        if again != text:
            raise KitError("%s.%s: its text changes with the hidden state; the rules and the "
                           "reminder must not show the secret (a look may)"
                           % (type(self).__name__, name))
        return text

    # -- the pieces a program may override -------------------------------------------------

    def command(self, action):
        """``(verb, words)`` of the action's last ``\\boxed{}``, lowercased, commas and
        semicolons read as spaces; ``("", [])`` without one."""
        words = (last_box(action) or "").lower().replace(",", " ").replace(";", " ").split()
        return (words[0], words[1:]) if words else ("", [])

    def intro(self):
        """The reset observation: the theme, then what the parts say."""
        theme = self.theme.strip()
        theme = theme[0].upper() + theme[1:] + ("" if theme[-1] in ".!?" else ".")
        parts = [theme, self.hidden.goal(),
                 "Commands: %s; \\boxed{%s %s} gives your final answer." % (
                     self.info.usage(self), self.answer_verb, self.hidden.example()),
                 self.scoring.rule(self), self.turns.rule(self),
                 "You have %d turns." % self.max_turns]
        return " ".join(p for p in parts if p)

    def look(self, words):
        """One use of the information action (counted first)."""
        self.looks += 1
        return self.info.look(self, words)

    def verdict(self, words):
        """``(reward, text)`` of the answer written in ``words``."""
        guess = self.hidden.read(words)
        closeness = 0.0 if guess is None else self.hidden.closeness(self.secret, guess)
        return self.scoring.score(self, min(1.0, max(0.0, float(closeness))))

    def reminder(self):
        return "Unknown command. Use \\boxed{%s ...} or \\boxed{%s ...}." % (
            self.info.verb, self.answer_verb)
