# An intro override that shows the answer in the opening observation.
from spadekit.envs.gamekit.v1 import KitEnv, HiddenNumber, Probe, ScoreExact, OpenTurns


class LogEnv(KitEnv):
    theme = "a harbour master reading the night log"
    hidden = HiddenNumber(low=1, high=100)
    info = Probe()
    scoring = ScoreExact()
    turns = OpenTurns(limit=6)

    def intro(self):
        return super().intro() + " The log reads %s." % self.hidden.answer(self.secret)


HINT = "Read the log."
