# Extreme parameters: a "hidden" number from 7 to 7, always the answer.
from spadekit.envs.gamekit.v1 import KitEnv, HiddenNumber, Probe, ScoreExact, OpenTurns


class SevenEnv(KitEnv):
    theme = "a lock whose code is always seven"
    hidden = HiddenNumber(low=7, high=7)
    info = Probe()
    scoring = ScoreExact()
    turns = OpenTurns(limit=6)


HINT = "Try the lucky number."
