"""Typed, range-checked parameters of the game kit's parts (kit version v1: frozen).

A part is a small class that declares its parameters once, as a tuple of :class:`Param`
(name, kind, range, default); ``Part.__init__`` takes them by keyword or in declared order,
checks each against its kind and range, then the part's own cross-parameter rule
(``Part.validate``). Any failure is a :class:`KitError` (a ``ValueError``) whose message starts
with ``Part.parameter:``, e.g. ``HiddenNumber.high: must be an int in [1, 1000000], got 0``:
raised while the program's class body runs, so the validator's load stage shows it as written.

Kinds: ``int`` (never a bool), ``float`` (an int is taken; finite), ``word`` (lowercase
letters, length in range), ``words`` (distinct words, a list/tuple or a string split on commas
and spaces, count in range) and ``chars`` (distinct lowercase letters or digits, count in range).
A part holds its parameters only; an episode's state lives on the environment, so one part
object serves every instance of a program. Standard library only, imports nothing of spadekit.
"""

import math
import re

__all__ = ["KitError", "Param", "Part"]

_WORD = re.compile(r"[a-z]+")
_CHAR = re.compile(r"[a-z0-9]")
_SPLIT = re.compile(r"[\s,;]+")


class KitError(ValueError):
    """A kit program put together wrongly: a bad parameter, a part in the wrong slot, a
    missing theme. The message names the part (or class) and the parameter."""


def _shown(value):
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


class Param:
    """One declared parameter: ``kind`` in int/float/word/words/chars, ``low``..``high`` its
    value's range (int/float) or its length's (word/words/chars), ``default`` its value."""

    KINDS = ("int", "float", "word", "words", "chars")

    def __init__(self, name, kind, low, high, default, doc=""):
        if kind not in self.KINDS:
            raise KitError("Param.kind: must be one of %s, got %r" % (", ".join(self.KINDS), kind))
        self.name, self.kind, self.low, self.high = name, kind, low, high
        self.default, self.doc = default, doc

    def describe(self):
        """What the parameter must be, as the error messages say it."""
        span = "[%s, %s]" % (self.low, self.high)
        return {"int": "an int in " + span, "float": "a number in " + span,
                "word": "one lowercase word of %d to %d letters" % (self.low, self.high),
                "words": "%d to %d distinct lowercase words" % (self.low, self.high),
                "chars": "%d to %d distinct lowercase letters or digits" % (self.low, self.high),
                }[self.kind]

    def check(self, owner, value):
        """The value, normalised (words lowercased, a float for ``float``); ``KitError`` naming
        ``owner.name`` when it is not of the kind or out of range."""
        got = self._normal(value)
        if got is None:
            raise KitError("%s.%s: must be %s, got %s" % (owner, self.name, self.describe(),
                                                          _shown(value)))
        return got

    def _normal(self, value):
        kind, low, high = self.kind, self.low, self.high
        if kind == "int":
            ok = isinstance(value, int) and not isinstance(value, bool) and low <= value <= high
            return value if ok else None
        if kind == "float":
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                return None
            value = float(value)
            return value if math.isfinite(value) and low <= value <= high else None
        if kind == "word":
            if not isinstance(value, str):
                return None
            value = value.strip().lower()
            return value if _WORD.fullmatch(value) and low <= len(value) <= high else None
        if kind == "chars":
            if not isinstance(value, str):
                return None
            chars = value.replace(" ", "").replace(",", "").lower()
            ok = all(_CHAR.fullmatch(c) for c in chars) and len(set(chars)) == len(chars)
            return chars if ok and low <= len(chars) <= high else None
        if isinstance(value, str):  # words
            value = [w for w in _SPLIT.split(value) if w]
        if not isinstance(value, (list, tuple)) or not all(isinstance(w, str) for w in value):
            return None
        words = tuple(w.strip().lower() for w in value)
        ok = all(_WORD.fullmatch(w) and len(w) <= 16 for w in words)
        return words if ok and len(set(words)) == len(words) and low <= len(words) <= high \
            else None


class Part:
    """The base of every part: declared ``PARAMS``, checked at construction.

    ``slot`` names where the part goes in a ``KitEnv`` (``hidden``, ``info``, ``scoring``,
    ``turns``). A subclass may add methods or override any; its parameters are attributes."""

    slot = ""
    PARAMS = ()

    def __init__(self, *args, **kwargs):
        name = type(self).__name__
        names = [p.name for p in self.PARAMS]
        if len(args) > len(names):
            raise KitError("%s: takes at most %d parameters in order (%s), got %d"
                           % (name, len(names), ", ".join(names) or "none", len(args)))
        given = dict(zip(names, args))
        for key, value in kwargs.items():
            if key not in names:
                raise KitError("%s.%s: no such parameter (%s has: %s)"
                               % (name, key, name, ", ".join(names) or "none"))
            if key in given:
                raise KitError("%s.%s: given twice" % (name, key))
            given[key] = value
        for param in self.PARAMS:
            setattr(self, param.name, param.check(name, given.get(param.name, param.default)))
        self.validate()

    def validate(self):
        """Cross-parameter rules of the part; raise ``self.fail(param, text)`` when broken."""

    def fail(self, param, text):
        """A ``KitError`` for parameter ``param`` of this part (to raise)."""
        return KitError("%s.%s: %s" % (type(self).__name__, param, text))

    def params(self):
        """The parameters as a dict."""
        return {p.name: getattr(self, p.name) for p in self.PARAMS}

    def __repr__(self):
        return "%s(%s)" % (type(self).__name__, ", ".join(
            "%s=%r" % item for item in self.params().items()))
