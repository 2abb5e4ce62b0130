# A reset override that plays the same seed whatever it is given.
from spadekit.envs.gamekit.v1 import KitEnv, HiddenNumber, Probe, ScoreExact, OpenTurns


class SameEnv(KitEnv):
    theme = "a riddle told the same way every night"
    hidden = HiddenNumber(low=1, high=100)
    info = Probe()
    scoring = ScoreExact()
    turns = OpenTurns(limit=6)

    def reset(self, *, seed=None, options=None):
        return super().reset(seed=7, options=options)


HINT = "Remember last night's answer."
