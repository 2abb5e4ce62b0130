"""Hidden states of the game kit (v1, frozen): what the player must find out.

A hidden state is a part (``slot = "hidden"``) holding parameters only. The secret itself is a
plain value that ``draw(rng)`` returns and the environment keeps (``env.secret``); every other
method reads it from its argument, so one part serves every instance. The members that the
other parts use, and that a program's own ``Hidden`` subclass provides:

- ``draw(rng)``: a secret, from ``rng`` only (a ``random.Random`` seeded by ``reset``);
- ``read(words)``: the candidate written in the words after a command, or None;
- ``closeness(secret, candidate)``: in [0, 1], 1.0 exactly when the candidate is the secret;
- ``answer(secret)``: the secret written as a player writes a candidate;
- ``facts(secret)``: true sentences that together pin the secret down (their number never
  depends on the secret: ``fact_count()``);
- ``goal()``/``example()``: the observation's sentence about what is hidden, a sample candidate.

Each parameter range keeps at least six possible secrets and a closeness that only a near
candidate earns, so no setting turns a game into a lottery.
"""

import random

from .params import Param, Part

__all__ = ["Hidden", "HiddenCause", "HiddenCell", "HiddenCode", "HiddenNumber", "HiddenOrder"]

ITEMS = ("amber", "cedar", "ember", "harbor", "meadow", "willow", "copper", "thistle")
"""The default items of ``HiddenCause`` (and the first four, of ``HiddenOrder``)."""


def _number(word, digits):
    """The int of ``word`` when it is at most ``digits`` ASCII digits, else None."""
    if word.isascii() and word.isdigit() and len(word) <= digits:
        return int(word)
    return None


class Hidden(Part):
    """The base of hidden states (see the module docstring for what a subclass provides)."""

    slot = "hidden"

    def draw(self, rng):
        raise NotImplementedError("%s.draw(rng) must return a secret" % type(self).__name__)

    def read(self, words):
        raise NotImplementedError("%s.read(words)" % type(self).__name__)

    def closeness(self, secret, candidate):
        return 1.0 if candidate == secret else 0.0

    def answer(self, secret):
        return str(secret)

    def facts(self, secret):
        raise NotImplementedError("%s.facts(secret): a hidden state of its own needs facts "
                                  "for Reveal and Clue" % type(self).__name__)

    def fact_count(self):
        return len(self.facts(self.draw(random.Random(0))))

    def goal(self):
        return "Something is hidden."

    def example(self):
        return "1"


class HiddenNumber(Hidden):
    """A whole number from ``low`` to ``high`` (at least 20 numbers)."""

    PARAMS = (Param("low", "int", 0, 1_000_000, 1, "smallest possible number"),
              Param("high", "int", 1, 1_000_000, 100, "largest possible number"))

    def validate(self):
        if self.high - self.low < 19:
            raise self.fail("high", "must be at least low + 19 (20 numbers or more), got "
                            "high=%d with low=%d" % (self.high, self.low))

    def draw(self, rng):
        return rng.randint(self.low, self.high)

    def read(self, words):
        return _number(words[0], 9) if words else None

    def closeness(self, secret, candidate):
        return max(0.0, 1.0 - abs(candidate - secret) / (self.high - self.low))

    def facts(self, secret):
        base = secret - secret % 10
        return ("the number is " + ("even" if secret % 2 == 0 else "odd"),
                "it leaves %d when divided by 7" % (secret % 7),
                "it lies from %d to %d" % (base, base + 9))

    def fact_count(self):
        return 3

    def goal(self):
        return "A whole number from %d to %d is hidden." % (self.low, self.high)

    def example(self):
        return str((self.low + self.high) // 2)


class HiddenCode(Hidden):
    """A code of ``length`` symbols drawn from ``symbols`` (repeats allowed; 16 codes or more)."""

    PARAMS = (Param("length", "int", 2, 8, 4, "symbols in the code"),
              Param("symbols", "chars", 2, 10, "abcdef", "the symbols a code is made of"))

    def validate(self):
        if len(self.symbols) ** self.length < 16:
            raise self.fail("length", "%d symbols make only %d codes of length %d: 16 or more "
                            "are needed" % (len(self.symbols), len(self.symbols) ** self.length,
                                            self.length))

    def draw(self, rng):
        return tuple(rng.choice(self.symbols) for _ in range(self.length))

    def read(self, words):
        text = "".join(words)
        if len(text) == self.length and all(c in self.symbols for c in text):
            return tuple(text)
        return None

    def closeness(self, secret, candidate):
        return sum(a == b for a, b in zip(secret, candidate)) / self.length

    def answer(self, secret):
        return " ".join(secret)

    def facts(self, secret):
        return tuple("position %d holds %s" % (i + 1, c) for i, c in enumerate(secret))

    def fact_count(self):
        return self.length

    def goal(self):
        return ("A code of %d symbols, each one of %s (repeats allowed), is hidden."
                % (self.length, ", ".join(self.symbols)))

    def example(self):
        return " ".join(self.symbols[0] * self.length)


class HiddenCell(Hidden):
    """One cell of a grid, rows 1 to ``rows`` and columns 1 to ``cols`` (9 cells or more)."""

    PARAMS = (Param("rows", "int", 2, 26, 5, "rows of the grid"),
              Param("cols", "int", 2, 26, 5, "columns of the grid"))

    def validate(self):
        if self.rows * self.cols < 9:
            raise self.fail("cols", "a grid of %d x %d has fewer than 9 cells"
                            % (self.rows, self.cols))

    def draw(self, rng):
        return (rng.randint(1, self.rows), rng.randint(1, self.cols))

    def read(self, words):
        if len(words) < 2:
            return None
        row, col = _number(words[0], 3), _number(words[1], 3)
        return None if row is None or col is None else (row, col)

    def closeness(self, secret, candidate):
        far = abs(candidate[0] - secret[0]) + abs(candidate[1] - secret[1])
        return max(0.0, 1.0 - far / (self.rows + self.cols - 2))

    def answer(self, secret):
        return "%d %d" % secret

    def facts(self, secret):
        return ("the row is %d" % secret[0], "the column is %d" % secret[1])

    def fact_count(self):
        return 2

    def goal(self):
        return ("One cell of a grid with rows 1-%d and columns 1-%d is hidden (write it as "
                "row then column)." % (self.rows, self.cols))

    def example(self):
        return "%d %d" % ((self.rows + 1) // 2, (self.cols + 1) // 2)


class HiddenCause(Hidden):
    """Which one of ``items`` (6 to 12 words) causes the effect."""

    PARAMS = (Param("items", "words", 6, 12, ITEMS, "the suspects, in their order"),)

    def draw(self, rng):
        return rng.choice(self.items)

    def read(self, words):
        return words[0] if words and words[0] in self.items else None

    def closeness(self, secret, candidate):
        gap = abs(self.items.index(candidate) - self.items.index(secret))
        return 1.0 - gap / (len(self.items) - 1)

    def answer(self, secret):
        return secret

    def facts(self, secret):
        return tuple(item + (" causes" if item == secret else " does not cause") + " the effect"
                     for item in self.items)

    def fact_count(self):
        return len(self.items)

    def goal(self):
        return "Exactly one of %s causes the effect." % ", ".join(self.items)

    def example(self):
        return self.items[0]


class HiddenOrder(Hidden):
    """The hidden order of ``items`` (4 to 8 words), first to last."""

    PARAMS = (Param("items", "words", 4, 8, ITEMS[:4], "the things to put in order"),)

    def draw(self, rng):
        order = list(self.items)
        rng.shuffle(order)
        return tuple(order)

    def read(self, words):
        n = len(self.items)
        return tuple(words[:n]) if sorted(words[:n]) == sorted(self.items) else None

    def closeness(self, secret, candidate):
        return sum(a == b for a, b in zip(secret, candidate)) / len(self.items)

    def answer(self, secret):
        return " ".join(secret)

    def facts(self, secret):
        return tuple("place %d holds %s" % (i + 1, item) for i, item in enumerate(secret))

    def fact_count(self):
        return len(self.items)

    def goal(self):
        return "%s stand in a hidden order, first to last." % ", ".join(self.items)

    def example(self):
        return " ".join(self.items)
