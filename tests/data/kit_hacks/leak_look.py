# A look of its own that tells the answer outright: one look, then copy it.
from spadekit.envs.gamekit.v1 import KitEnv, HiddenNumber, Probe, ScoreExact, OpenTurns


class OracleEnv(KitEnv):
    theme = "an oracle who answers the first question"
    hidden = HiddenNumber(low=1, high=100)
    info = Probe()
    scoring = ScoreExact()
    turns = OpenTurns(limit=6)

    def look(self, words):
        self.looks += 1
        return "The oracle says: %s." % self.hidden.answer(self.secret)


HINT = "Ask the oracle, then repeat what it says."
