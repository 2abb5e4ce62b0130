"""Turn structures of the game kit (v1, frozen): the control flow of one turn.

A turn structure is a part (``slot = "turns"``) with ``limit``, the episode's turns (2 to 25).
``play(env, verb, words)`` runs one turn given the command word and the words after it and
returns ``(text, reward, ended)``: the information action's verb looks (``env.look``), the answer
verb answers (``env.verdict``, which ends the episode), anything else gets the reminder
(``env.remind``). The
environment truncates at ``env.max_turns``. Subclasses refuse a look (``refuse_look``) or an
answer (``refuse_answer``) by returning a text instead of None; ``free_looks()`` is how many
looks the derived solution makes and the thrifty rule does not charge for; ``rule(env)`` is the
observation's sentence about the structure.
"""

from .params import Param, Part

__all__ = ["BudgetTurns", "GatedTurns", "OpenTurns", "Turns"]


def _limit(default=8):
    return Param("limit", "int", 2, 25, default, "turns in an episode")


class Turns(Part):
    """The base of turn structures (see the module docstring)."""

    slot = "turns"
    PARAMS = (_limit(),)

    def play(self, env, verb, words):
        if verb == env.info.verb:
            refused = self.refuse_look(env)
            if refused is not None:
                return refused, 0.0, False
            return self.after_look(env, env.look(words)), 0.0, False
        if verb == env.answer_verb:
            refused = self.refuse_answer(env)
            if refused is not None:
                return refused, 0.0, False
            reward, text = env.verdict(words)
            return text, reward, True
        return env.remind(), 0.0, False

    def refuse_look(self, env):
        return None

    def refuse_answer(self, env):
        return None

    def after_look(self, env, text):
        return text

    def free_looks(self):
        return 1

    def rule(self, env):
        return ""


class OpenTurns(Turns):
    """Look as often as you like; an answer ends the episode."""


class BudgetTurns(Turns):
    """At most ``looks`` looks in an episode."""

    PARAMS = (_limit(), Param("looks", "int", 1, 10, 3, "looks allowed"))

    def validate(self):
        if self.looks >= self.limit:
            raise self.fail("looks", "must be below limit (%d) to leave a turn for the answer, "
                            "got %d" % (self.limit, self.looks))

    def refuse_look(self, env):
        return "No looks left: answer now." if env.looks >= self.looks else None

    def after_look(self, env, text):
        return "%s Looks left: %d." % (text, self.looks - env.looks)

    def rule(self, env):
        return "You may look at most %d times." % self.looks


class GatedTurns(Turns):
    """An answer counts only after at least ``looks`` looks."""

    PARAMS = (_limit(), Param("looks", "int", 1, 4, 1, "looks required before answering"))

    def validate(self):
        if self.looks >= self.limit:
            raise self.fail("looks", "must be below limit (%d) to leave a turn for the answer, "
                            "got %d" % (self.limit, self.looks))

    def refuse_answer(self, env):
        if env.looks < self.looks:
            return "Look at least %d time%s before you answer." % (
                self.looks, "" if self.looks == 1 else "s")
        return None

    def free_looks(self):
        return self.looks

    def rule(self, env):
        return "An answer counts only after at least %d look%s." % (
            self.looks, "" if self.looks == 1 else "s")
