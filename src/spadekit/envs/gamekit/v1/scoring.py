"""Scoring rules of the game kit (v1, frozen): what the final answer earns.

A scoring rule is a part (``slot = "scoring"``). ``score(env, closeness)`` turns the answer's
closeness (``env.hidden.closeness``, 0.0 for an unreadable answer) into ``(reward, text)``;
``rule(env)`` is the observation's sentence about it. Every rule pays 1.0 for an exact answer
and less than 1.0 for anything else, so the solution alone reaches full score; partial credit
is bounded by the parameter ranges (at most 0.5 for a near answer, a power of at least 5 on
closeness), so answering at random earns well below an exact answer whatever the setting.
"""

from .params import Param, Part

__all__ = ["ScoreBanded", "ScoreExact", "ScoreSteep", "ScoreThrifty", "Scoring"]

NEAR_MISS = 0.999
"""The most a non-exact answer can earn under any kit rule."""


class Scoring(Part):
    """The base of scoring rules (see the module docstring)."""

    slot = "scoring"

    def score(self, env, closeness):
        if closeness >= 1.0:
            return 1.0, "Exactly right."
        return 0.0, "Wrong: it was %s." % env.hidden.answer(env.secret)

    def rule(self, env):
        return "An exact answer scores 1; anything else scores 0."


class ScoreExact(Scoring):
    """1.0 for the exact answer, 0.0 for anything else."""


class ScoreSteep(Scoring):
    """Closeness to the power ``power`` (exact: 1.0)."""

    PARAMS = (Param("power", "int", 5, 10, 6, "power of closeness"),)

    def score(self, env, closeness):
        if closeness >= 1.0:
            return 1.0, "Exactly right: score 1."
        reward = min(NEAR_MISS, round(closeness ** self.power, 3))
        return reward, "Closeness %.2f, score %.3f; it was %s." % (
            min(closeness, 0.99), reward, env.hidden.answer(env.secret))

    def rule(self, env):
        return ("An answer scores its closeness to the hidden one to the power %d "
                "(exact: 1)." % self.power)


class ScoreBanded(Scoring):
    """1.0 exact, ``partial`` for a closeness of at least ``near``, else 0.0."""

    PARAMS = (Param("near", "float", 0.75, 0.95, 0.8, "closeness that earns partial credit"),
              Param("partial", "float", 0.05, 0.5, 0.3, "the partial credit"))

    def score(self, env, closeness):
        if closeness >= 1.0:
            return 1.0, "Exactly right: score 1."
        if closeness >= self.near:
            return self.partial, "Close: score %g; it was %s." % (
                self.partial, env.hidden.answer(env.secret))
        return 0.0, "Too far off: score 0; it was %s." % env.hidden.answer(env.secret)

    def rule(self, env):
        return ("An exact answer scores 1, one with closeness %g or more scores %g, others 0."
                % (self.near, self.partial))


class ScoreThrifty(Scoring):
    """An exact answer scores 1.0 less ``cost`` per look beyond the ones the turn structure
    requires (never below ``floor``); anything else 0.0."""

    PARAMS = (Param("cost", "float", 0.02, 0.3, 0.1, "charge per extra look"),
              Param("floor", "float", 0.0, 0.5, 0.2, "least an exact answer scores"))

    def score(self, env, closeness):
        if closeness < 1.0:
            return 0.0, "Wrong: it was %s." % env.hidden.answer(env.secret)
        extra = max(0, env.looks - env.turns.free_looks())
        reward = round(max(self.floor, 1.0 - self.cost * extra), 3)
        return reward, "Right, after %d looks: score %g." % (env.looks, reward)

    def rule(self, env):
        free = env.turns.free_looks()
        return ("An exact answer scores 1 minus %g for every look after the first%s; others 0."
                % (self.cost, "" if free == 1 else " %d" % free))
