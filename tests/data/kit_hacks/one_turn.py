# Extreme parameters: one turn, a one-cell grid, and a reveal that shows everything.
from spadekit.envs.gamekit.v1 import KitEnv, HiddenCell, Reveal, ScoreExact, OpenTurns


class PointEnv(KitEnv):
    theme = "a map with a single square"
    hidden = HiddenCell(rows=1, cols=1)
    info = Reveal()
    scoring = ScoreExact()
    turns = OpenTurns(limit=1)


HINT = "There is only one square."
