# Degenerate scoring: any answer is "near" and earns almost full marks.
from spadekit.envs.gamekit.v1 import KitEnv, HiddenNumber, Probe, ScoreBanded, OpenTurns


class KindEnv(KitEnv):
    theme = "a teacher who likes every answer"
    hidden = HiddenNumber(low=1, high=100)
    info = Probe()
    scoring = ScoreBanded(near=0.0, partial=0.99)
    turns = OpenTurns(limit=6)


HINT = "Any answer will do."
