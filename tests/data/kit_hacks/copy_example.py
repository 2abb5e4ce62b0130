# Partial credit a copied answer earns: the opening observation's example answer is the middle
# of a wide range, and a steep score still pays it about a third on average.
from spadekit.envs.gamekit.v1 import KitEnv, HiddenNumber, Probe, ScoreSteep, OpenTurns


class MiddleEnv(KitEnv):
    theme = "a scale that rewards a safe middle guess"
    hidden = HiddenNumber(low=10, high=200)
    info = Probe()
    scoring = ScoreSteep(power=5)
    turns = OpenTurns(limit=6)


HINT = "Probe a few numbers, then answer the one whose closeness reads 1."
