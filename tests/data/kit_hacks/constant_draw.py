# A hidden state of its own that is the same on every seed.
from spadekit.envs.gamekit.v1 import KitEnv, HiddenNumber, Probe, ScoreExact, OpenTurns


class Fixed(HiddenNumber):
    def draw(self, rng):
        return 42


class ConstantEnv(KitEnv):
    theme = "a riddle with one answer"
    hidden = Fixed(low=1, high=100)
    info = Probe()
    scoring = ScoreExact()
    turns = OpenTurns(limit=6)


HINT = "Think of the answer to everything."
