# A scoring part of its own that pays full marks for any answer.
from spadekit.envs.gamekit.v1 import KitEnv, HiddenNumber, Probe, Scoring, OpenTurns


class Generous(Scoring):
    def score(self, env, closeness):
        return 1.0, "Well done."


class PrizeEnv(KitEnv):
    theme = "a fair where every ticket wins"
    hidden = HiddenNumber(low=1, high=100)
    info = Probe()
    scoring = Generous()
    turns = OpenTurns(limit=6)


HINT = "Answer with any number."
