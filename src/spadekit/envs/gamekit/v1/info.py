"""Information actions of the game kit (v1, frozen): the command that tells the player
something without ending the episode.

An information action is a part (``slot = "info"``) with a ``verb`` parameter, the command
word (its own name by default: ``\\boxed{probe 50}``). The members the environment uses:

- ``usage(env)``: the observation's text about the command, with an example in ``\\boxed{}``;
- ``look(env, words)``: what one use tells (``env.looks`` already counts it); it reads the
  secret through ``env.hidden`` and ``env.secret`` and keeps nothing on the part;
- ``step(env)``: the command the derived solution uses to look (any honest look will do).

Every action works with every hidden state: a probe measures ``closeness``, a reveal shows the
numbered fact the player asks for, a clue shows the next fact in turn.
"""

import math

from .params import Param, Part

__all__ = ["Clue", "Info", "Probe", "Reveal"]


def _verb(default):
    return Param("verb", "word", 2, 12, default, "the command word")


class Info(Part):
    """The base of information actions (see the module docstring)."""

    slot = "info"
    PARAMS = (_verb("look"),)

    def usage(self, env):
        return "\\boxed{%s} tells you something" % self.verb

    def look(self, env, words):
        raise NotImplementedError("%s.look(env, words)" % type(self).__name__)

    def step(self, env):
        return self.verb


class Probe(Info):
    """How close a candidate is to the secret, from 0 to 1 (shown rounded down, so only the
    exact answer shows as 1)."""

    PARAMS = (_verb("probe"), Param("decimals", "int", 1, 3, 2, "decimals shown"))

    def _shown(self, closeness):
        scale = 10 ** self.decimals
        return "%.*f" % (self.decimals, math.floor(closeness * scale) / scale)

    def usage(self, env):
        return ("\\boxed{%s %s} tells how close a candidate is, from 0 to 1 (1 is exact)"
                % (self.verb, env.hidden.example()))

    def look(self, env, words):
        guess = env.hidden.read(words)
        if guess is None:
            return "Give a candidate after %s, e.g. \\boxed{%s %s}." % (
                self.verb, self.verb, env.hidden.example())
        return "Closeness of that candidate: %s." % self._shown(
            env.hidden.closeness(env.secret, guess))

    def step(self, env):
        return "%s %s" % (self.verb, env.hidden.answer(env.secret))


class Reveal(Info):
    """The fact with the number the player asks for."""

    PARAMS = (_verb("reveal"),)

    def usage(self, env):
        return ("\\boxed{%s 1} shows fact number 1 (any number from 1 to %d)"
                % (self.verb, env.hidden.fact_count()))

    def look(self, env, words):
        facts = env.hidden.facts(env.secret)
        word = words[0] if words else ""
        k = int(word) if word.isascii() and word.isdigit() and len(word) <= 3 else 0
        if not 1 <= k <= len(facts):
            return "Ask for a fact by its number, from 1 to %d: \\boxed{%s 1}." % (
                len(facts), self.verb)
        return "Fact %d: %s." % (k, facts[k - 1])

    def step(self, env):
        return "%s 1" % self.verb


class Clue(Info):
    """The next fact, in turn (after the last, the first again)."""

    PARAMS = (_verb("clue"),)

    def usage(self, env):
        return "\\boxed{%s} gives the next clue" % self.verb

    def look(self, env, words):
        facts = env.hidden.facts(env.secret)
        k = (env.looks - 1) % len(facts) + 1
        return "Clue %d: %s." % (k, facts[k - 1])
