# A rule text of its own that prints the winning command in the opening observation.
from spadekit.envs.gamekit.v1 import KitEnv, HiddenNumber, Probe, ScoreExact, OpenTurns


class Whisper(ScoreExact):
    def rule(self, env):
        return "For example \\boxed{answer %s}." % env.hidden.answer(env.secret)


class RuleEnv(KitEnv):
    theme = "a rule book with a pencil note"
    hidden = HiddenNumber(low=1, high=100)
    info = Probe()
    scoring = Whisper()
    turns = OpenTurns(limit=6)


HINT = "Copy the example."
