# Degenerate scoring: closeness to the power 0 is 1 for every answer.
from spadekit.envs.gamekit.v1 import KitEnv, HiddenNumber, Probe, ScoreSteep, OpenTurns


class FlatEnv(KitEnv):
    theme = "a scale that always balances"
    hidden = HiddenNumber(low=1, high=100)
    info = Probe()
    scoring = ScoreSteep(power=0)
    turns = OpenTurns(limit=6)


HINT = "Answer anything."
